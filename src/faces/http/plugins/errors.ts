import type { FastifyError, FastifyInstance } from 'fastify';
import { AppError, envelope, isAppError } from '../../../errors.js';
import { isPaymentError, paymentErrorBody } from '../../../pay/x402/requirements.js';
import { isOpenAiPath, openAiErrorBody, openAiShouldRetry } from '../../openai-errors.js';
import { dependencyUnavailable, isDependencyError } from '../../../queue/redis.js';
import { noteRequest } from './request-log.js';

/** The one place errors become responses: every failure leaves in the documented envelope. */
export function installErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler((raw: FastifyError | AppError | Error, req, reply) => {
    const err = toAppError(raw);
    // Refusals by limit or payment, by their code (tollgate_refusals_total{reason}).
    app.container?.metrics.refused(err.code);
    // Said on the request's one log line: a fault of ours with its stack; the caller's failures and
    // expected ones (an upstream down, Redis unreachable) by code and message only.
    noteRequest(req, { error: err, ...(err.code === 'internal_error' ? { fault: raw } : {}) });
    for (const [k, v] of Object.entries(err.headers)) reply.header(k, v);
    if (err.status === 402 || err.status === 403) reply.header('x-should-retry', 'false');
    // x402 clients read x402Version and accepts at the top level of a payment 402.
    if (isPaymentError(err)) return reply.status(err.status).send(paymentErrorBody(err, req.id));
    // The OpenAI-compatible paths answer in OpenAI's error shape, which its client SDKs parse, and say
    // whether a retry can help: the SDKs would otherwise send every 5xx three times.
    if (isOpenAiPath(req.url)) {
      return reply
        .status(err.status)
        .header('x-should-retry', String(openAiShouldRetry(err)))
        .send(openAiErrorBody(err, req.id));
    }
    return reply.status(err.status).send(envelope(err, req.id));
  });
  app.setNotFoundHandler((req, reply) => {
    const err = new AppError('not_found', `No route ${req.method} ${req.url.split('?')[0]}. GET / lists the endpoints.`);
    if (isOpenAiPath(req.url)) return reply.status(404).header('x-should-retry', 'false').send(openAiErrorBody(err, req.id));
    return reply.status(404).send(envelope(err, req.id));
  });
}

function toAppError(e: FastifyError | AppError | Error): AppError {
  if (isAppError(e)) return e;
  if (isDependencyError(e)) return dependencyUnavailable();
  const fe = e as FastifyError;
  switch (fe.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new AppError('payload_too_large', 'Request body is too large');
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new AppError('unsupported_media_type', 'Send the body as application/json');
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new AppError('invalid_input', 'Body is empty but Content-Type is application/json; send {} for no input');
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      // Fastify's own message repeats this and adds nothing.
      return new AppError('invalid_input', 'Body is not valid JSON');
  }
  if (fe instanceof SyntaxError || fe.statusCode === 400) {
    return new AppError('invalid_input', `Body is not valid JSON: ${fe.message}`);
  }
  if (fe.statusCode === 413) return new AppError('payload_too_large', 'Request body is too large');
  if (fe.statusCode === 415) return new AppError('unsupported_media_type', 'Send the body as application/json');
  return new AppError('internal_error', 'Something went wrong on our side; the request id helps us find it');
}
