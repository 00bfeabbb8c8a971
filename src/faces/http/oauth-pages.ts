/**
 * The OAuth pages a person sees (src/faces/http/oauth.ts): sign in, the one-time link, consent and
 * plain messages. Server-rendered HTML that works without JavaScript; every value is escaped.
 */

import { escapeHtml } from './browser-pages.js';

/** Pages are never framed (clickjacking) and run no script; forms post to this service only. */
export const PAGE_HEADERS = {
  'content-type': 'text/html; charset=utf-8',
  'cache-control': 'no-store',
  'x-frame-options': 'DENY',
  'content-security-policy': "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'",
  // same-origin, not no-referrer: with no-referrer Chromium sends `Origin: null` on the pages' own form posts.
  'referrer-policy': 'same-origin',
} as const;

const STYLE = `
body{font:16px/1.5 system-ui,sans-serif;max-width:44rem;margin:2rem auto;padding:0 1rem;color:#1b1b1b}
h1{font-size:1.4rem}fieldset{border:1px solid #ccc;border-radius:6px;margin:1rem 0;padding:.5rem 1rem}
legend{font-weight:600}label{display:inline-block;margin:.15rem 1rem .15rem 0}
.error{background:#fde8e8;border:1px solid #e0a0a0;padding:.5rem 1rem;border-radius:6px}
.muted{color:#555;font-size:.9rem}code{background:#f3f3f3;padding:0 .2rem;border-radius:3px}
button{font-size:1rem;padding:.4rem 1.2rem;margin-right:.5rem}input[type=password],input[type=text],input[type=number]{font-size:1rem;padding:.3rem;width:100%;box-sizing:border-box}
`;

function page(title: string, body: string): string {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>${escapeHtml(title)} · Tollgate</title><style>${STYLE}</style></head><body>${body}</body></html>`;
}

const errorBox = (error: string | undefined) => (error ? `<p class="error" role="alert">${escapeHtml(error)}</p>` : '');

export interface ClientView {
  name: string;
  /** Where the browser goes back to: shown so the person can tell which app asks. */
  redirectHost: string;
}

export function signInPage(o: { client: ClientView; requestId: string; base: string; error?: string }): string {
  const who = escapeHtml(o.client.name);
  return page(
    'Sign in',
    `<h1>${who} wants to use tools of your Tollgate account</h1>
<p class="muted">It will return to <code>${escapeHtml(o.client.redirectHost)}</code>. You choose which tools it may call and how much it may spend each month.</p>
${errorBox(o.error)}
<form method="post" action="/oauth/sign-in">
<input type="hidden" name="request" value="${escapeHtml(o.requestId)}">
<p><label for="api_key">Your account's production API key (<code>cv_...</code>)</label>
<input type="password" id="api_key" name="api_key" autocomplete="off" required></p>
<p class="muted">The key signs you in on this page only; the app never sees it.</p>
<button type="submit">Sign in</button>
</form>
<h2>No key in this browser?</h2>
<p class="muted">Where your key is, make a one-time sign-in link and open it in this browser within 10 minutes:</p>
<pre><code>curl -X POST ${escapeHtml(o.base)}/oauth/sign-in-links -H "Authorization: Bearer cv_..."</code></pre>`,
  );
}

export function linkPage(o: { secret: string; error?: string }): string {
  return page(
    'Sign in with a link',
    `<h1>Sign in to Tollgate</h1>${errorBox(o.error)}
<p>This one-time link signs this browser in to your account for 15 minutes, to approve an app's access.</p>
<form method="post" action="/oauth/sign-in/link">
<input type="hidden" name="link" value="${escapeHtml(o.secret)}">
<button type="submit">Sign in</button>
</form>`,
  );
}

export interface ToolChoice {
  name: string;
  family: string;
  price: string;
}

export function consentPage(o: {
  client: ClientView;
  requestId: string;
  csrf: string;
  tools: ToolChoice[];
  sets: Array<{ name: string; tools: string[] }>;
  defaultCapDollars: string;
  error?: string;
}): string {
  const byFamily = new Map<string, ToolChoice[]>();
  for (const t of o.tools) byFamily.set(t.family, [...(byFamily.get(t.family) ?? []), t]);
  const families = [...byFamily]
    .map(
      ([family, tools]) => `<fieldset><legend>${escapeHtml(family)}</legend>
<label><input type="checkbox" name="families" value="${escapeHtml(family)}"> every ${escapeHtml(family)} tool</label><br>
${tools.map((t) => `<label><input type="checkbox" name="tools" value="${escapeHtml(t.name)}"> ${escapeHtml(t.name)} <span class="muted">$${escapeHtml(t.price)}</span></label>`).join('\n')}
</fieldset>`,
    )
    .join('\n');
  const sets = o.sets.length
    ? `<fieldset><legend>Your tool sets</legend>${o.sets
        .map(
          (s) =>
            `<label><input type="checkbox" name="sets" value="${escapeHtml(s.name)}"> ${escapeHtml(s.name)} <span class="muted">(${escapeHtml(s.tools.join(', '))})</span></label>`,
        )
        .join('<br>')}</fieldset>`
    : '';
  return page(
    'Allow access',
    `<h1>Allow ${escapeHtml(o.client.name)} to call tools for your account?</h1>
<p class="muted">It will return to <code>${escapeHtml(o.client.redirectHost)}</code>. Each successful call is charged to your account at the tool's price, up to the monthly cap below. You can revoke this access at any time (<code>DELETE /keys/{key_id}</code>; it is listed under <code>GET /keys</code> as a grant).</p>
${errorBox(o.error)}
<form method="post" action="/oauth/consent">
<input type="hidden" name="request" value="${escapeHtml(o.requestId)}">
<input type="hidden" name="csrf" value="${escapeHtml(o.csrf)}">
<p>Tools it may call (pick tools, whole families or your tool sets):</p>
${sets}
${families}
<p><label for="monthly_cap">Monthly spending cap, in dollars</label>
<input type="number" id="monthly_cap" name="monthly_cap" min="0.01" step="0.01" value="${escapeHtml(o.defaultCapDollars)}" required></p>
<button type="submit" name="decision" value="approve">Allow</button>
<button type="submit" name="decision" value="deny" formnovalidate>Deny</button>
</form>`,
  );
}

export function messagePage(title: string, text: string): string {
  return page(title, `<h1>${escapeHtml(title)}</h1><p>${escapeHtml(text)}</p>`);
}
