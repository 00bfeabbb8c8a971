# Production image: TypeScript compiled in a build stage; the runtime stage has production
# dependencies, dist/, migrations/, bin/ and README.md (served at /docs), runs plain node as the
# non-root `node` user under tini.

# --- build: every dependency, then `npm run build` (tsc -p tsconfig.build.json into dist/)
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json README.md ./
COPY src ./src
COPY workers ./workers
RUN npm run build

# --- production dependencies only, in a stage of their own so npm's cache stays behind
FROM node:20-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund

# --- runtime
FROM node:20-bookworm-slim
# tini as PID 1: passes SIGTERM/SIGINT to node (which stops gracefully on them) and reaps zombies.
RUN apt-get update \
  && apt-get install -y --no-install-recommends tini \
  && rm -rf /var/lib/apt/lists/*
WORKDIR /app
ENV NODE_ENV=production
# Files stay owned by root: the service never writes to /app.
COPY package.json package-lock.json ./
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY migrations ./migrations
COPY bin ./bin
COPY README.md ./
USER node
EXPOSE 8080
ENTRYPOINT ["/usr/bin/tini", "--"]
# The API with inline workers. Compose runs the same image as separate processes:
#   node dist/src/server.js (WORKERS=off), node dist/workers/index.js --family <f>,
#   node dist/src/cli/migrate.js, node dist/src/cli/admin.js <command> (or npm run -s admin:prod -- <command>).
CMD ["node", "dist/src/server.js"]
