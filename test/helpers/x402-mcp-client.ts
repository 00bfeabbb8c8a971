import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { x402Client } from '@x402/core/client';
import type { PaymentPayload, PaymentRequired } from '@x402/core/types';
import { ExactEvmScheme } from '@x402/evm';
import type { PrivateKeyAccount } from 'viem';

/**
 * An x402 MCP client as x402's reference package (typescript/packages/mcp, x402MCPClient) builds it,
 * which is not published on npm: an MCP SDK client, and x402's own x402Client with the `exact` EVM
 * scheme to sign. callTool follows the reference's callTool: call without payment; on an isError
 * result carrying a PaymentRequired (structuredContent first, else content[0].text) create the
 * PaymentPayload and call again with it in `_meta["x402/payment"]`; read `_meta["x402/payment-response"]`.
 */
export interface PaidCall {
  result: CallToolResult;
  /** The payment sent, when one was needed. */
  payment?: PaymentPayload;
  paymentRequired?: PaymentRequired;
}

export class X402McpTestClient {
  readonly mcp = new Client({ name: 'x402-mcp-test', version: '1.0.0' });
  readonly payments: x402Client;
  /** The payment-identifier id to put in the next payments (the reference docs' client hook). */
  paymentId: string | undefined;

  constructor(
    private readonly url: string,
    account: PrivateKeyAccount,
    private readonly headers: Record<string, string> = {},
  ) {
    this.payments = new x402Client().register('eip155:*', new ExactEvmScheme(account));
    // @x402/extensions' appendPaymentIdentifierToExtensions: only when the server declared it.
    this.payments.onBeforePaymentCreation(async ({ paymentRequired }) => {
      const ext = paymentRequired.extensions?.['payment-identifier'] as { info?: { required?: boolean; id?: string } } | undefined;
      if (this.paymentId && ext?.info && typeof ext.info.required === 'boolean') ext.info.id = this.paymentId;
    });
  }

  async connect(): Promise<this> {
    await this.mcp.connect(new StreamableHTTPClientTransport(new URL(this.url), { requestInit: { headers: this.headers } }));
    return this;
  }

  async close(): Promise<void> {
    await this.mcp.close();
  }

  /** One tools/call as sent, `_meta` included. */
  async raw(name: string, args: Record<string, unknown>, payment?: unknown): Promise<CallToolResult> {
    return (await this.mcp.callTool({ name, arguments: args, ...(payment !== undefined ? { _meta: { 'x402/payment': payment } } : {}) })) as CallToolResult;
  }

  /** The reference client's callTool: pays when asked to. */
  async callTool(name: string, args: Record<string, unknown>): Promise<PaidCall> {
    const first = await this.raw(name, args);
    const paymentRequired = paymentRequiredOf(first);
    if (!paymentRequired) return { result: first };
    const payment = await this.payments.createPaymentPayload(paymentRequired);
    return { result: await this.raw(name, args, payment), payment, paymentRequired };
  }
}

/** The reference client's extractPaymentRequiredFromResult. */
export function paymentRequiredOf(result: CallToolResult): PaymentRequired | undefined {
  if (!result.isError) return undefined;
  const is = (v: unknown): v is PaymentRequired =>
    typeof v === 'object' && v !== null && 'x402Version' in v && Array.isArray((v as { accepts?: unknown }).accepts);
  if (is(result.structuredContent)) return result.structuredContent;
  const first = result.content[0];
  if (first?.type !== 'text') return undefined;
  try {
    const parsed: unknown = JSON.parse(first.text);
    return is(parsed) ? parsed : undefined;
  } catch {
    return undefined;
  }
}
