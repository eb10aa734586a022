# Sourced by .ci/test and .ci/check-flag-catalog.sh: uv reads no pip configuration, so the
# find-links folders pip is given here (PIP_FIND_LINKS, else pip's own configuration files: on the
# CI machine the CPU build of torch lies there) are handed to uv as UV_FIND_LINKS, unless set
# (pip separates them by whitespace, uv by commas).
if [[ -z "${UV_FIND_LINKS:-}" ]]; then
  _uv_links="${PIP_FIND_LINKS:-$("${PYTHON:-python3}" -m pip config get global.find-links 2>/dev/null || true)}"
  _uv_links="$(echo $_uv_links | tr ' ' ',')"
  [[ -z "$_uv_links" ]] || export UV_FIND_LINKS="$_uv_links"
  unset _uv_links
fi
