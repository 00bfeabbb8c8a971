-- A sign-up no longer refuses an email that already has an account (that answer told strangers which
-- emails have accounts): an email is an unverified contact, and several accounts may give the same one.
-- Kept indexed for the operator's look-ups.
DROP INDEX IF EXISTS signups_email_idx;
CREATE INDEX signups_email_lower_idx ON signups (lower(email));
