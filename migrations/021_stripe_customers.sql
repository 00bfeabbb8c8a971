-- Card payments (src/pay/card): the Stripe customer each account pays as. One per account and one
-- account per customer; written when the account first opens a Checkout session. The usage export
-- (src/pay/export) sends an account's charges to a Stripe meter under this customer.
CREATE TABLE stripe_customers (
  account_id   uuid PRIMARY KEY REFERENCES accounts (id),
  customer_id  text NOT NULL UNIQUE CHECK (customer_id ~ '^cus_[A-Za-z0-9]+$'),
  created_at   timestamptz NOT NULL DEFAULT now()
);
