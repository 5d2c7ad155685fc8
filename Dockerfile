# syntax=docker/dockerfile:1
# stormgate gateway image. Build: docker build -t stormgate .   Run: docker compose up (see grafana/README.md).

# --- build: every dependency, TypeScript compiled to dist/ -------------------------------------------------------
FROM node:20-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build
# The compose `demo` profile runs the bundled mock provider from this stage (`npm run mock`, which needs src/ and tsx).

# --- runtime: production dependencies and the compiled gateway, as a non-root user -------------------------------
FROM node:20-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY config ./config
# `node` (uid 1000) comes with the official Node.js images.
USER node
EXPOSE 8080
# Slim images have no curl: ask node. config/docker.yaml listens on 0.0.0.0:8080.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:8080/healthz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
CMD ["node", "dist/main.js", "--config", "/app/config/docker.yaml"]
