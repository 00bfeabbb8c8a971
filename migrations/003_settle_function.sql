-- Settlement of a batch of charges in one call. Being a function, its statement is planned once per
-- connection and reused, which matters on the hot path (planning cost as much as executing).
-- Input: a JSON array of {entry_key, account_id, key_id, tool, amount, agent_name, payer, usage, kind}.
-- Inserts ledger rows (a row already there for the same entry_key is skipped) and moves each account's
-- balance by the sum of the rows actually inserted. Returns the balance of every account in the batch.
CREATE FUNCTION settle_charges(batch jsonb) RETURNS TABLE (account_id uuid, credits bigint)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY
  WITH input AS (
    SELECT * FROM jsonb_to_recordset(batch) AS x(
      entry_key text, account_id uuid, key_id uuid, tool text, amount bigint,
      agent_name text, payer text, usage jsonb, kind text)
  ), ins AS (
    INSERT INTO ledger (entry_key, account_id, key_id, kind, tool, delta_cents, agent_name, payer, usage)
    SELECT i.entry_key, i.account_id, i.key_id, i.kind, i.tool, -i.amount, i.agent_name, i.payer, i.usage FROM input i
    ON CONFLICT (entry_key) DO NOTHING
    RETURNING ledger.account_id, ledger.delta_cents
  ), agg AS (
    SELECT ins.account_id, SUM(ins.delta_cents) AS d FROM ins WHERE ins.account_id IS NOT NULL GROUP BY ins.account_id
  ), upd AS (
    UPDATE accounts a SET credits = a.credits + agg.d FROM agg WHERE a.id = agg.account_id
    RETURNING a.id, a.credits
  )
  SELECT a.id, COALESCE(upd.credits, a.credits)
  FROM accounts a LEFT JOIN upd ON upd.id = a.id
  WHERE a.id IN (SELECT i.account_id FROM input i WHERE i.account_id IS NOT NULL);
END;
$$;
