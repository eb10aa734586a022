#!/bin/sh
# Install escha-deploy into its own virtual environment, /opt/escha/venv, from the wheelhouse
# in /opt/escha/wheelhouse, with no network. SGLang's own environment is left untouched.
#   install-escha.sh PYTHON_VERSION     (the wheelhouse's target, e.g. 3.12; checked here)
set -eu
want="$1"
have="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$have" != "$want" ]; then
    echo "error: the base image's python3 is $have but the wheelhouse was built for $want;" \
         "rebuild it: scripts/build-wheelhouse.sh $have" >&2
    exit 3
fi
if python3 -m venv /opt/escha/venv 2>/dev/null; then
    /opt/escha/venv/bin/python -m pip install --quiet --no-index --no-cache-dir \
        --disable-pip-version-check --find-links /opt/escha/wheelhouse escha-deploy
else
    # no ensurepip in the base (some Ubuntu images): a pip-less venv filled by the base's pip
    rm -rf /opt/escha/venv
    python3 -m venv --without-pip /opt/escha/venv
    python3 -m pip --python /opt/escha/venv/bin/python install --quiet --no-index \
        --no-cache-dir --disable-pip-version-check --find-links /opt/escha/wheelhouse escha-deploy
fi
ln -sf /opt/escha/venv/bin/escha-deploy /usr/local/bin/escha-deploy
rm -rf /opt/escha/wheelhouse
/opt/escha/venv/bin/escha-deploy --help >/dev/null
