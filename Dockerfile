# rocm-isolation-webhook: the image the Deployment in manifests/ runs.
#   docker build -t REGISTRY/rocm-isolation-webhook:0.1.0 .
#   rocm-isolation-webhook manifests --image REGISTRY/rocm-isolation-webhook:0.1.0 | kubectl apply -f -
# The Python version is the one CI tests with.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# A C compiler for mypyc (setup.py): the decision core is compiled (half the CPU per review).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# README.md* : the readme is optional for the build (the glob may match nothing).
COPY pyproject.toml setup.py README.md* ./
COPY webhook ./webhook
# webhook/_manifests is a symlink to manifests/: the wheel ships the manifests for `manifests`.
COPY manifests ./manifests
# mypyc type-checks against the installed dependencies: install them, then build without isolation.
RUN pip install "setuptools>=68" wheel "mypy>=1.10" . \
    && ROCM_ISOLATION_COMPILE=1 pip wheel --no-build-isolation --wheel-dir /wheels . \
    && python -c "import glob, sys, zipfile; w = glob.glob('/wheels/rocm_isolation_webhook-*.whl'); \
sys.exit(0 if any(n.startswith('webhook/core/engine.') and n.endswith('.so') for n in zipfile.ZipFile(w[0]).namelist()) else 'not compiled')"

FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The same numeric uid/gid as runAsUser/runAsGroup in manifests/base/deployment.yaml, so
# runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 10001 webhook \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin webhook
COPY --from=build /wheels /wheels
RUN pip install --no-compile /wheels/*.whl && rm -rf /wheels
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["rocm-isolation-webhook"]
CMD ["serve", "--cert-dir=/certs", "--policy=/etc/rocm-isolation/policy.yaml", "--port=8443"]
