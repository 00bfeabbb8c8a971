-- Webhooks for chain and parallel requests (src/calls/webhooks.ts, `watch`). A flow ends in several
-- jobs with no single stored result, so the body GET /jobs/{root} answers is kept here when the flow
-- ends, and every delivery attempt sends exactly that.
ALTER TABLE webhook_jobs ADD COLUMN body jsonb;
