import { describe, expect, it } from 'vitest';
import { cleanEmail, contactPageTask, decodeCfEmail, emailsInText, toE164 } from '../../../src/tools/web/contact-parse.js';

const cf = (key: number, email: string) => key.toString(16).padStart(2, '0') + Buffer.from(Buffer.from(email).map((b) => b ^ key)).toString('hex');
const page = (html: string, country: string | null = null) =>
  contactPageTask({ body: Buffer.from(html), baseUrl: 'https://acme.test/', headerCharset: null, country });

describe('contact extraction', () => {
  it('decodes Cloudflare data-cfemail (UTF-8 too) and rejects junk', () => {
    expect(decodeCfEmail(cf(0x5a, 'a.b@example.org'))).toBe('a.b@example.org');
    expect(decodeCfEmail(cf(0x01, 'jörg@example.de'))).toBe('jörg@example.de');
    expect(decodeCfEmail('zz12')).toBeNull();
    expect(decodeCfEmail('ab')).toBeNull();
  });

  it('finds emails in text with [at]/(at)/{at} and [dot] obfuscation; image names are not emails', () => {
    expect(emailsInText('Write to Jane.Doe [at] Example [dot] com, sales (at) example.org or {at}-less x{at}y.io')).toEqual([
      'jane.doe@example.com',
      'sales@example.org',
      'x@y.io',
    ]);
    expect(emailsInText('icon@2x.png and banner@3x.webp')).toEqual([]);
    expect(cleanEmail('mailto:Info@Example.COM.')).toBe('info@example.com');
    expect(cleanEmail('not an email')).toBeNull();
    expect(cleanEmail(`a@b.co${'.'.repeat(100_000)}x`)).toBeNull();
  });

  it('obfuscation matching stays linear on hostile text (long whitespace runs, many brackets)', () => {
    const t0 = Date.now();
    expect(emailsInText(' '.repeat(400_000) + 'x')).toEqual([]);
    expect(emailsInText(('a' + ' '.repeat(50)).repeat(8_000))).toEqual([]);
    expect(emailsInText(' [ at '.repeat(60_000))).toEqual([]);
    expect(Date.now() - t0).toBeLessThan(2_000);
  });

  it('phones in E.164: country as default region, invalid numbers dropped', () => {
    expect(toE164('030 98765432', 'DE')).toBe('+493098765432');
    expect(toE164('(212) 555-0123', 'US')).toBe('+12125550123');
    expect(toE164('030 98765432', null)).toBeNull();
    expect(toE164('+44 20 7946 0958', 'DE')).toBe('+442079460958');
    expect(toE164('12', 'DE')).toBeNull();
  });

  it('one page: mailto lists, cfemail links, tel:, text numbers, socials (not share links), JSON-LD, forms, candidate links', () => {
    const out = page(
      `<html><head><script type="application/ld+json">[{"@type":"LocalBusiness","email":"shop@acme.test","telephone":"+1 212 555 0188",
        "address":{"@type":"PostalAddress","streetAddress":"1 Main St","addressLocality":"New York","addressRegion":"NY","postalCode":"10001","addressCountry":{"@type":"Country","name":"US"}}}]</script></head>
       <body><a href="mailto:a@acme.test,b@acme.test?cc=c@acme.test">mail</a>
       <a href="/cdn-cgi/l/email-protection#${cf(0x33, 'cf@acme.test')}">[email protected]</a>
       <a href="tel:%2B1-212-555-0123">call</a> Office: (212) 555-0199
       <a href="https://github.com/acme">gh</a> <a href="https://facebook.com/sharer.php?u=x">share</a> <a href="https://www.youtube.com/">yt home</a>
       <a href="/kontakt">Kontakt</a> <a href="/blog">Our story: about us</a> <a href="/shop">Shop</a>
       <form action="search" method="get"><input name="q"><input type="submit"></form>
       <script>var fake = "script@acme.test";</script></body></html>`,
      'US',
    );
    expect(out.emails).toEqual(['a@acme.test', 'b@acme.test', 'cf@acme.test', 'shop@acme.test']);
    expect(out.phones).toEqual(['+12125550123', '+12125550188', '+12125550199']);
    expect(out.socials).toEqual([{ network: 'github', url: 'https://github.com/acme' }]);
    expect(out.addresses).toEqual([
      { street: '1 Main St', locality: 'New York', region: 'NY', postal_code: '10001', country: 'US', text: '1 Main St, 10001 New York, NY, US' },
    ]);
    expect(out.forms).toEqual([{ action: 'https://acme.test/search', method: 'GET', fields: ['q'] }]);
    expect(out.candidates.map((c) => c.url)).toEqual(['https://acme.test/kontakt', 'https://acme.test/blog']);
    expect(out.truncated).toBe(false);
  });

  it('deeply nested markup is cut at the parse cap, quickly, without a stack overflow', () => {
    const deep = '<div>'.repeat(200_000) + 'deep@acme.test' + '</div>'.repeat(200_000);
    const t0 = Date.now();
    const out = page(`<html><body><a href="mailto:top@acme.test">m</a>${deep}</body></html>`);
    expect(out.truncated).toBe(true);
    expect(out.emails).toEqual(['top@acme.test']);
    expect(Date.now() - t0).toBeLessThan(5_000);
  });
});
