import { describe, expect, it } from 'vitest';
import { TOOLS } from '../../../src/tools/index.js';

/**
 * The contract's tool catalogue and list prices (tool-execution API, "Tool catalogue and list prices"
 * and the edge-network suite), copied here so the repository stands alone: every tool it names exists
 * in the plan tier it names, at its price in cents, and nothing else is registered.
 */
const SPEC: Record<string, Record<string, number>> = {
  free: { web_search: 0, page_fetch: 0, domain_check: 0, check_balance: 0, quick_vibe: 5, intent_to_spec: 5, deploy_verify: 0 },
  starter: { hints: 5, hints_plus: 10, roast: 5, one_liner: 2, name_it: 3, price_it: 5 },
  pro: {
    genius: 50,
    mind_opener: 8,
    idea_fold: 10,
    hints_parade: 100,
    beacon_scan: 1,
    beacon_rank: 1,
    beacon_compress: 2,
    beacon_extract: 1,
    beacon_focus: 2,
    context_health: 1,
    context_compress: 2,
    context_extract: 0,
    compute: 2,
    cvi_loop: 0,
    cvi_verify: 0,
    fico_score: 0,
    cf_analytics: 0,
    cf_list_dns: 0,
    cf_bandwidth: 0,
    cf_list_page_rules: 0,
    cf_block_ip: 2,
    cf_list_workers: 0,
    cf_bulk_dns: 5,
    cf_list_zones: 0,
    cf_cache_rules: 0,
    cf_point_to_server: 3,
    cf_create_dns: 2,
    cf_purge_all: 2,
    cf_create_page_rule: 3,
    cf_purge_cache: 2,
    cf_create_zone: 3,
    cf_setup_email: 3,
    cf_delete_dns: 2,
    cf_ssl_mode: 2,
    cf_delete_page_rule: 2,
    cf_ssl_status: 0,
    cf_delete_worker: 2,
    cf_threats: 0,
    cf_deploy_worker: 5,
    cf_under_attack: 0,
    cf_dev_mode: 0,
    cf_update_dns: 2,
    cf_find_zone: 0,
    cf_update_page_rule: 2,
    cf_firewall_rules: 0,
    cf_get_dns: 0,
    cf_get_zone: 0,
  },
  enterprise: {
    genius_plus: 65,
    bcalc: 5,
    bcalc_why: 10,
    discovery_collision: 15,
    chaos_fingerprint: 5,
    resonance: 2,
    prime_residue: 5,
    echo_sequence: 2,
    conversation_diagnostic: 0,
    handoff: 0,
    grabr_scrape: 0,
    grabr_contact: 0,
    grabr_wayback: 0,
    grabr_sitemap: 0,
    grabr_batch: 0,
    grabr_intel: 0,
    grabr_transcript: 8,
    grabr_video_intel: 12,
    skeptic_pov: 30,
    magnum_dependency_dag: 20,
    passport_send: 5,
    passport_store: 0,
  },
};

const named = Object.entries(SPEC).flatMap(([tier, tools]) => Object.entries(tools).map(([name, cents]) => ({ name, tier, cents })));

describe('the catalogue the contract names', () => {
  it('names 82 tools', () => {
    expect(named.length).toBe(82);
    expect(new Set(named.map((t) => t.name)).size).toBe(82);
  });

  it.each(named.map((t) => [t.name, t] as const))('%s exists in its tier at its price', (_n, t) => {
    const tool = TOOLS.find((x) => x.name === t.name);
    expect(tool, `${t.name} is registered`).toBeDefined();
    expect({ tier: tool!.tier, cents: tool!.priceCents }).toEqual({ tier: t.tier, cents: t.cents });
  });

  it('registers nothing the contract does not name', () => {
    const extra = TOOLS.map((t) => t.name).filter((n) => !named.some((t) => t.name === n));
    expect(extra).toEqual([]);
  });

  it('every catalogue tool declares an output schema and examples that parse', () => {
    for (const tool of TOOLS) {
      if (tool.family === 'edge' || ['compute', 'check_balance', 'page_fetch', 'domain_check', 'genius', 'hints', 'roast'].includes(tool.name)) continue;
      expect(tool.outputSchema, `${tool.name} outputSchema`).toBeDefined();
      expect(tool.examples.length, `${tool.name} examples`).toBeGreaterThan(0);
      for (const ex of tool.examples) expect(tool.input.safeParse(ex).success, `${tool.name} example parses`).toBe(true);
    }
  });
});
