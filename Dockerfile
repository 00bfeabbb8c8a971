FROM node:20-bookworm-slim
WORKDIR /app
ENV NODE_ENV=production
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund
COPY tsconfig.json ./
COPY src ./src
COPY workers ./workers
COPY migrations ./migrations
COPY bin ./bin
COPY README.md ./
EXPOSE 8080
CMD ["npm", "start"]
