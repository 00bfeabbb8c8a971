/**
 * An MCP client (the official SDK) over Streamable HTTP: list the tools this key may call, then call one.
 *   TOLLGATE_URL=http://localhost:8080 TOLLGATE_KEY=cv_... npx tsx examples/mcp.ts
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const baseUrl = process.env.TOLLGATE_URL;
const apiKey = process.env.TOLLGATE_KEY;
if (!baseUrl || !apiKey) {
  console.error('Set TOLLGATE_URL (e.g. http://localhost:8080) and TOLLGATE_KEY (an API key, cv_...).');
  process.exit(2);
}

interface Charged {
  result: { value: number };
  cost_cents: number;
  remaining_credits: number;
}

async function main(): Promise<void> {
  const client = new Client({ name: 'tollgate-example', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL('/mcp', `${baseUrl!.replace(/\/+$/, '')}/`), {
    requestInit: { headers: { authorization: `Bearer ${apiKey}` } },
  });
  await client.connect(transport);
  try {
    console.log(`connected to ${client.getServerVersion()?.name} ${client.getServerVersion()?.version}`);

    // tools/list: only the tools this key may call, each with its input schema and price.
    const { tools } = await client.listTools();
    const shown = tools.slice(0, 5).map((t) => t.name);
    console.log(`tools: ${tools.length} (${shown.join(', ')}${tools.length > shown.length ? ', ...' : ''})`);
    if (!tools.some((t) => t.name === 'compute')) throw new Error('compute is not among the tools this key may call');

    // tools/call: charged like POST /tools/compute; the answer is text plus structuredContent.
    const res = await client.callTool({ name: 'compute', arguments: { expression: '6 * 7' } });
    if (res.isError) {
      const content = res.content as Array<{ type: string; text?: string }>;
      throw new Error(`compute failed: ${content[0]?.text ?? 'no text'}`);
    }
    const out = res.structuredContent as unknown as Charged;
    console.log(`compute: 6 * 7 = ${out.result.value} (cost ${out.cost_cents} cents, ${out.remaining_credits} credits left)`);
  } finally {
    await client.close();
  }
}

main().catch((err: unknown) => {
  console.error('FAILED:', err instanceof Error ? err.message : err);
  process.exit(1);
});
