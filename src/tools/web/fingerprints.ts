/**
 * grabr_intel's technology fingerprints, kept in the repository (the wappalyzer package is no longer
 * maintained as open source). Fingerprints go stale as products change their markup, so the table is
 * versioned: bump FINGERPRINTS_VERSION (date-based) whenever an entry is added, changed or removed, and
 * grabr_intel reports the version it matched against.
 *
 * Every pattern is a fixed, linear-time regular expression written here (no caller ever supplies one),
 * matched against bounded inputs: header values, cookie names, meta tags, script URLs, and the first
 * 512 KiB of HTML. A capture group 1, when present and matched, is reported as the version.
 */

export const FINGERPRINTS_VERSION = '2026.07.1';

export interface Fingerprint {
  name: string;
  category: 'server' | 'cdn' | 'framework' | 'cms' | 'ecommerce' | 'analytics' | 'javascript' | 'hosting' | 'security' | 'language' | 'tag_manager' | 'widget';
  /** Response header (lower-case name) -> pattern its value must match ('' = the header's presence is enough). */
  headers?: Record<string, RegExp | ''>;
  /** Cookie names (from Set-Cookie) matching this pattern. */
  cookies?: RegExp;
  /** <meta name="..."> (lower-case name) -> pattern of its content. */
  meta?: Record<string, RegExp>;
  /** Patterns of <script src> URLs. */
  scripts?: RegExp[];
  /** Patterns of the HTML itself (kept specific: these run on the page's first 512 KiB). */
  html?: RegExp[];
}

export const FINGERPRINTS: readonly Fingerprint[] = [
  // Servers and platforms
  { name: 'nginx', category: 'server', headers: { server: /\bnginx(?:\/([\d.]+))?/i } },
  { name: 'Apache HTTP Server', category: 'server', headers: { server: /\bApache(?:\/([\d.]+))?/i } },
  { name: 'Microsoft IIS', category: 'server', headers: { server: /\bMicrosoft-IIS(?:\/([\d.]+))?/i } },
  { name: 'LiteSpeed', category: 'server', headers: { server: /\bLiteSpeed/i } },
  { name: 'Caddy', category: 'server', headers: { server: /\bCaddy\b/i } },
  { name: 'Envoy', category: 'server', headers: { server: /\benvoy\b/i, 'x-envoy-upstream-service-time': '' } },
  { name: 'OpenResty', category: 'server', headers: { server: /\bopenresty(?:\/([\d.]+))?/i } },
  { name: 'Express', category: 'framework', headers: { 'x-powered-by': /\bExpress\b/i } },
  { name: 'PHP', category: 'language', headers: { 'x-powered-by': /\bPHP(?:\/([\d.]+))?/i }, cookies: /^PHPSESSID$/ },
  { name: 'ASP.NET', category: 'framework', headers: { 'x-aspnet-version': /([\d.]+)/, 'x-powered-by': /\bASP\.NET\b/i }, cookies: /^ASP\.NET_SessionId$/ },
  { name: 'Java', category: 'language', cookies: /^JSESSIONID$/ },
  { name: 'Django', category: 'framework', cookies: /^(?:csrftoken|django_language)$/, html: [/name=["']csrfmiddlewaretoken["']/i] },
  { name: 'Ruby on Rails', category: 'framework', cookies: /^_[a-z0-9_]+_session$/, meta: { 'csrf-param': /^authenticity_token$/ } },
  { name: 'Laravel', category: 'framework', cookies: /^(?:laravel_session|XSRF-TOKEN)$/ },
  // CDNs, hosting and security
  { name: 'Cloudflare', category: 'cdn', headers: { 'cf-ray': '', server: /^cloudflare$/i }, cookies: /^(?:__cf_bm|__cflb|cf_clearance)$/ },
  { name: 'Amazon CloudFront', category: 'cdn', headers: { 'x-amz-cf-id': '', via: /CloudFront/i } },
  { name: 'Fastly', category: 'cdn', headers: { 'x-fastly-request-id': '', 'x-served-by': /\bcache-[a-z0-9]+-[A-Z]{3}\b/ } },
  { name: 'Akamai', category: 'cdn', headers: { 'x-akamai-transformed': '', server: /AkamaiGHost/i } },
  { name: 'Varnish', category: 'cdn', headers: { 'x-varnish': '', via: /\bvarnish\b/i } },
  { name: 'Vercel', category: 'hosting', headers: { 'x-vercel-id': '', server: /^Vercel$/i } },
  { name: 'Netlify', category: 'hosting', headers: { 'x-nf-request-id': '', server: /^Netlify$/i } },
  { name: 'GitHub Pages', category: 'hosting', headers: { server: /^GitHub\.com$/i } },
  { name: 'Heroku', category: 'hosting', headers: { via: /\bvegur\b/i } },
  { name: 'Amazon S3', category: 'hosting', headers: { server: /^AmazonS3$/i, 'x-amz-request-id': '' } },
  { name: 'Google Cloud', category: 'hosting', headers: { via: /\b1\.1 google\b/i, server: /^(?:gws|Google Frontend|ESF)$/i } },
  { name: 'HSTS', category: 'security', headers: { 'strict-transport-security': '' } },
  // CMS and e-commerce
  {
    name: 'WordPress',
    category: 'cms',
    meta: { generator: /^WordPress(?: ([\d.]+))?/i },
    scripts: [/\/wp-(?:content|includes)\//i],
    html: [/\/wp-content\//i],
    headers: { link: /rel="https:\/\/api\.w\.org\/"/i },
  },
  {
    name: 'Drupal',
    category: 'cms',
    meta: { generator: /^Drupal(?: (\d+))?/i },
    headers: { 'x-drupal-cache': '', 'x-generator': /\bDrupal(?: (\d+))?/i },
    html: [/\bdata-drupal-selector=/i],
  },
  { name: 'Joomla', category: 'cms', meta: { generator: /^Joomla!?(?: ([\d.]+))?/i } },
  { name: 'Ghost', category: 'cms', meta: { generator: /^Ghost(?: ([\d.]+))?/i } },
  { name: 'Hugo', category: 'cms', meta: { generator: /^Hugo(?: ([\d.]+))?/i } },
  { name: 'Jekyll', category: 'cms', meta: { generator: /^Jekyll(?: v?([\d.]+))?/i } },
  { name: 'Wix', category: 'cms', meta: { generator: /^Wix\.com/i }, headers: { 'x-wix-request-id': '' } },
  { name: 'Squarespace', category: 'cms', html: [/\bstatic1?\.squarespace\.com\b/i], headers: { server: /^Squarespace$/i } },
  { name: 'Webflow', category: 'cms', meta: { generator: /^Webflow\b/i }, html: [/\bdata-wf-page=/i] },
  {
    name: 'Shopify',
    category: 'ecommerce',
    headers: { 'x-shopid': '', 'x-shopify-stage': '' },
    scripts: [/\bcdn\.shopify\.com\//i],
    cookies: /^_shopify_[a-z]+$/,
  },
  { name: 'WooCommerce', category: 'ecommerce', scripts: [/\/woocommerce\//i], html: [/\bwoocommerce-(?:page|cart|no-js)\b/i] },
  { name: 'Magento', category: 'ecommerce', cookies: /^(?:frontend|mage-cache-storage)$/, html: [/\bMage\.Cookies\b/] },
  // JavaScript frameworks and libraries
  {
    name: 'Next.js',
    category: 'framework',
    headers: { 'x-powered-by': /^Next\.js(?: ([\d.]+))?/i },
    scripts: [/\/_next\/static\//],
    html: [/<script id="__NEXT_DATA__"/],
  },
  { name: 'Nuxt', category: 'framework', scripts: [/\/_nuxt\//], html: [/\bwindow\.__NUXT__\b/, /<div id="__nuxt"/] },
  { name: 'Gatsby', category: 'framework', meta: { generator: /^Gatsby(?: ([\d.]+))?/i }, html: [/<div id="___gatsby"/] },
  { name: 'Astro', category: 'framework', meta: { generator: /^Astro(?: v?([\d.]+))?/i } },
  { name: 'SvelteKit', category: 'framework', html: [/\bdata-sveltekit-[a-z]+=/] },
  { name: 'React', category: 'javascript', scripts: [/\breact(?:-dom)?(?:\.production)?(?:\.min)?\.js\b/i], html: [/\bdata-reactroot\b/] },
  {
    name: 'Vue.js',
    category: 'javascript',
    scripts: [/\bvue(?:@([\d.]+))?(?:\/dist\/vue)?(?:\.runtime)?(?:\.global)?(?:\.prod)?(?:\.min)?\.js\b/i],
    html: [/\bdata-v-[0-9a-f]{8}\b/],
  },
  { name: 'Angular', category: 'javascript', html: [/\bng-version="([\d.]+)"/] },
  { name: 'jQuery', category: 'javascript', scripts: [/\bjquery[.-]?([\d.]+)?(?:\.slim)?(?:\.min)?\.js\b/i, /\/jquery@([\d.]+)\//i] },
  {
    name: 'Bootstrap',
    category: 'javascript',
    scripts: [/\bbootstrap(?:\.bundle)?(?:\.min)?\.js\b/i],
    html: [/\bbootstrap(?:@([\d.]+))?(?:\/dist\/css\/bootstrap)?(?:\.min)?\.css\b/i],
  },
  { name: 'Tailwind CSS', category: 'javascript', scripts: [/\bcdn\.tailwindcss\.com\b/i] },
  // Analytics, tags and widgets
  { name: 'Google Analytics', category: 'analytics', scripts: [/\bgoogle-analytics\.com\/(?:ga|analytics)\.js/i, /\bgoogletagmanager\.com\/gtag\/js\b/i] },
  {
    name: 'Google Tag Manager',
    category: 'tag_manager',
    scripts: [/\bgoogletagmanager\.com\/gtm\.js\b/i],
    html: [/\bgoogletagmanager\.com\/ns\.html\?id=GTM-/i],
  },
  { name: 'Plausible', category: 'analytics', scripts: [/\bplausible\.io\/js\//i] },
  { name: 'Matomo', category: 'analytics', scripts: [/\b(?:matomo|piwik)\.js\b/i] },
  { name: 'Segment', category: 'analytics', scripts: [/\bcdn\.segment\.com\/analytics\.js\b/i] },
  { name: 'Hotjar', category: 'analytics', scripts: [/\bstatic\.hotjar\.com\//i] },
  { name: 'Intercom', category: 'widget', scripts: [/\bwidget\.intercom\.io\//i, /\bjs\.intercomcdn\.com\//i] },
  { name: 'HubSpot', category: 'widget', scripts: [/\bjs\.hs-scripts\.com\//i, /\bjs\.hsforms\.net\//i] },
  { name: 'Stripe', category: 'widget', scripts: [/\bjs\.stripe\.com\//i] },
  { name: 'reCAPTCHA', category: 'security', scripts: [/\bgoogle\.com\/recaptcha\//i, /\brecaptcha\.net\/recaptcha\//i] },
];
