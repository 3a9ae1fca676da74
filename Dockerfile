# One image for every role: `serve --role all`, `control-plane` or `data-plane`.
#
#   docker build -t cornserve:0.1.0 .
#   docker run --rm -p 8000:8000 -e CORNSERVE_ADMIN_TOKEN=secret cornserve:0.1.0 serve --host 0.0.0.0

ARG NODE_IMAGE=node:20-bookworm-slim

FROM ${NODE_IMAGE} AS build
# @riaskov/mmap-io compiles with node-gyp; sharp, zeromq and onnxruntime-node ship prebuilt binaries.
RUN apt-get update \
  && apt-get install -y --no-install-recommends python3 make g++ \
  && rm -rf /var/lib/apt/lists/*
# npm 11 reads package.json's allowScripts, which decides which dependencies' install scripts run.
ARG NPM_VERSION=11.19.1
RUN npm install --global --no-audit --no-fund npm@${NPM_VERSION}
# node-gyp compiles against the headers the Node image ships instead of downloading them.
ENV npm_config_nodedir=/usr/local
# onnxruntime-node's install script would fetch CUDA libraries from outside the registry; its CPU build
# is in the package. A CUDA image installs them by building with ONNXRUNTIME_NODE_INSTALL=cuda12.
ARG ONNXRUNTIME_NODE_INSTALL=skip
ENV ONNXRUNTIME_NODE_INSTALL=${ONNXRUNTIME_NODE_INSTALL}
WORKDIR /app
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
COPY src ./src
# The web console's sources: `prepare` bundles them into dist/console with Vite.
COPY console ./console
# `npm ci` refuses this lockfile with some npm versions; `npm install` follows it. Its `prepare` compiles
# src to dist with TypeScript, a dev dependency, so the dev dependencies are pruned only afterwards.
# ffmpeg and ffprobe (video containers) come as static binaries in optional packages on linux-x64; their
# install scripts only `chmod u+x` for root, and the server runs as another user, so all may run them.
RUN npm install --no-audit --no-fund \
  && npm prune --omit=dev --no-audit --no-fund \
  && npm cache clean --force \
  && { chmod a+rx node_modules/@ffmpeg-installer/*/ffmpeg node_modules/@ffprobe-installer/*/ffprobe || true; }

FROM ${NODE_IMAGE}
# tini as PID 1 forwards SIGTERM to cornserve and reaps any process orphaned under it.
RUN apt-get update \
  && apt-get install -y --no-install-recommends tini \
  && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY bin ./bin
COPY examples ./examples
# The code stays root-owned and read-only to the server; only its state and model cache are writable.
RUN mkdir -p /var/lib/cornserve/state /var/lib/cornserve/models \
  && chown -R 1000:1000 /var/lib/cornserve
ENV NODE_ENV=production \
  PATH=/app/bin:$PATH \
  CORNSERVE_STATE_DIR=/var/lib/cornserve/state \
  CORNSERVE_MODEL_DIR=/var/lib/cornserve/models
# The base image's `node` user, by number so that Kubernetes' runAsNonRoot can verify it.
USER 1000:1000
EXPOSE 8000 8001
ENTRYPOINT ["/usr/bin/tini", "--", "cornserve"]
CMD ["serve", "--host", "0.0.0.0"]
