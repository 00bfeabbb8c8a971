import { httpUrlField } from './guarded-http.js';

/**
 * Input pieces the grabr_* tools share: the web family's one http(s) URL field
 * (httpUrlField: a bare host gets https, only http(s), no credentials, no fragment).
 */
export const webUrl = httpUrlField('An http(s) URL; a bare host such as "example.com" is fetched over https.');
