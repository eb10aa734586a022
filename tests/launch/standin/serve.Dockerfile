# STAND-IN image for the one-plan tests: the Debian test base plus the REAL escha-deploy from
# this checkout (its dependencies from the offline wheelhouse), a runtime description declaring
# our series' capabilities, and a STAND-IN for SGLang's interpreter (record_child.py) that
# prints the argv and environment `serve` gave it, then runs the stand-in HTTP server.
ARG BASE=escha-sglang-base:ci
FROM ${BASE}
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/escha/venv \
 && /opt/escha/venv/bin/python -m pip install --quiet --no-index --no-cache-dir \
      --disable-pip-version-check /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels
COPY src/ /opt/escha/src/
COPY server.py record_child.py /standin/
COPY config.json /etc/standin/config.json
COPY runtime.json /etc/escha/runtime.json
RUN printf '#!/bin/sh\nexec /opt/escha/venv/bin/python -m escha_deploy.cli.main "$@"\n' > /usr/local/bin/escha-deploy \
 && printf '#!/bin/sh\nexec python3 -u /standin/record_child.py "$@"\n' > /standin/sglang-python \
 && chmod +x /usr/local/bin/escha-deploy /standin/sglang-python
ENV PYTHONPATH=/opt/escha/src ESCHA_SGLANG_PYTHON=/standin/sglang-python
LABEL io.escha.runtime.capabilities="hicache-host-reserve-env,hicache-host-allocator,transfer-geometry-check" \
      io.escha.standin="true"
ENTRYPOINT ["escha-deploy", "serve"]
