/**
 * What a tool sees of passports (ctx.passports) and the limits both sides check: the handlers in
 * passports.ts here validate input with them, and access/passports.ts stores and seals under them.
 */
export const PASSPORT_MIN_TTL_S = 60;
export const PASSPORT_MAX_TTL_S = 30 * 86400;
export const PASSPORT_DEFAULT_TTL_S = 86400;
export const PASSPORT_LABEL_MAX = 200;
/** Largest page of list and inbox. */
export const PASSPORT_PAGE_MAX = 100;
/** `to` value that addresses the calling key itself. */
export const SELF = 'self';

export const HANDLE_RE = /^pp_[A-Za-z0-9_-]{32}$/;
export const DELIVERY_RE = /^dl_[A-Za-z0-9_-]{22}$/;

export interface PassportMeta {
  handle: string;
  label: string | null;
  bytes: number;
  sha256: string;
  created_at: string;
  expires_at: string;
  from_key_id: string | null;
}

export interface PassportPut {
  handle: string;
  bytes: number;
  sha256: string;
  expires_at: string;
}

export interface PassportContent extends PassportMeta {
  content: string;
}

export interface PassportPage {
  passports: PassportMeta[];
  /** Live passports of the account (this namespace), all pages together. */
  total: number;
  /** Pass as `cursor` for the next page; null on the last one. */
  next_cursor: string | null;
}

export interface Delivery {
  delivery_id: string;
  handle: string;
  from_key_id: string | null;
  label: string | null;
  bytes: number;
  sha256: string;
  sent_at: string;
  expires_at: string;
}

export interface InboxPage {
  deliveries: Delivery[];
  total: number;
  next_cursor: string | null;
}

export interface SendResult {
  delivery_id: string;
  handle: string;
  to_key_id: string;
  expires_at: string;
  /** Sandbox keys: nothing was stored or delivered. */
  dry_run?: true;
}

export interface PageOpts {
  limit?: number;
  cursor?: string;
}

/** The per-call view a handler gets as ctx.passports: bound to the caller's account, key and sandbox flag. */
export interface PassportApi {
  put(input: { content: string; label?: string | null; ttl_s?: number }): Promise<PassportPut>;
  get(handle: string): Promise<PassportContent>;
  list(opts?: PageOpts): Promise<PassportPage>;
  /** Deliveries addressed to the calling key. */
  inbox(opts?: PageOpts): Promise<InboxPage>;
  /** Deletes a passport of the account (its deliveries disappear from every inbox). */
  delete(handle: string): Promise<{ handle: string; deleted: true }>;
  /** Removes one delivery from the calling key's inbox (the passport stays). */
  dismiss(deliveryId: string): Promise<{ delivery_id: string; deleted: true }>;
  send(input: { to: string; handle?: string; content?: string; label?: string | null; ttl_s?: number }): Promise<SendResult>;
}
