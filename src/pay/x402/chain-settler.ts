import {
  BaseError,
  ContractFunctionRevertedError,
  TransactionReceiptNotFoundError,
  createPublicClient,
  createWalletClient,
  defineChain,
  http,
  parseSignature,
  toEventSelector,
  type Chain,
  type PublicClient,
  type WalletClient,
} from 'viem';
import { privateKeyToAccount, type PrivateKeyAccount } from 'viem/accounts';
import type { Config } from '../../config.js';
import type { PaymentPayload } from './payload.js';
import { networkProfile, type NetworkProfile, type PaymentRequirements } from './requirements.js';
import {
  INSUFFICIENT_FUNDS,
  NONCE_USED_ON_CHAIN,
  RPC_UNREACHABLE,
  SETTLEMENT_UNCONFIRMED,
  SettlerStartupError,
  type PaymentSettler,
  type SettleHooks,
  type SettleResult,
  type SettlementLookup,
  type SettlementState,
  type VerifyResult,
} from './settle-types.js';

/** What the service reads from and calls on an EIP-3009 token (USDC's FiatToken v2 signatures). */
export const EIP3009_ABI = [
  { type: 'function', name: 'balanceOf', stateMutability: 'view', inputs: [{ name: 'account', type: 'address' }], outputs: [{ type: 'uint256' }] },
  {
    type: 'function',
    name: 'authorizationState',
    stateMutability: 'view',
    inputs: [
      { name: 'authorizer', type: 'address' },
      { name: 'nonce', type: 'bytes32' },
    ],
    outputs: [{ type: 'bool' }],
  },
  {
    type: 'function',
    name: 'transferWithAuthorization',
    stateMutability: 'nonpayable',
    inputs: [
      { name: 'from', type: 'address' },
      { name: 'to', type: 'address' },
      { name: 'value', type: 'uint256' },
      { name: 'validAfter', type: 'uint256' },
      { name: 'validBefore', type: 'uint256' },
      { name: 'nonce', type: 'bytes32' },
      { name: 'v', type: 'uint8' },
      { name: 'r', type: 'bytes32' },
      { name: 's', type: 'bytes32' },
    ],
    outputs: [],
  },
  {
    type: 'event',
    name: 'AuthorizationUsed',
    inputs: [
      { name: 'authorizer', type: 'address', indexed: true },
      { name: 'nonce', type: 'bytes32', indexed: true },
    ],
  },
] as const;

/** errorReason / invalidReason values of self-settlement. */
export const TRANSACTION_REVERTED = 'transaction_reverted';

/** Chain reads before a call must not hold it up for long; a slow node is treated as unreachable. */
const READ_TIMEOUT_MS = 10_000;

/**
 * How far back (in blocks) a transfer of a used nonce is searched for when no transaction of it was
 * recorded: about 5.5 hours on Base (2 s blocks), far more than the reconciler's grace period, and
 * within the log range public RPC endpoints accept in one request.
 */
export const LOG_LOOKBACK_BLOCKS = 10_000n;

/** The viem chain for X402_NETWORK (its id from X402_CHAIN_ID when set) at `rpc`. */
function chainAt(profile: NetworkProfile, rpc: string): Chain {
  return defineChain({
    id: profile.chainId,
    name: profile.network,
    nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [rpc] } },
  });
}

/**
 * Reads what became of an authorization (the payment reconciler's question): the receipt of a
 * transaction recorded for it, else the token's `authorizationState(authorizer, nonce)` and, for a
 * used nonce, the `AuthorizationUsed` event that names the transfer. Read-only: no key.
 */
export class ChainLookup implements SettlementLookup {
  private readonly profile: NetworkProfile;
  private readonly reader: PublicClient;

  /** `rpc`: a JSON-RPC endpoint of X402_NETWORK's chain (the settler passes its own client instead). */
  constructor(config: Config, rpc: string | PublicClient) {
    this.reader =
      typeof rpc === 'string'
        ? createPublicClient({ chain: chainAt(networkProfile(config), rpc), transport: http(rpc, { timeout: READ_TIMEOUT_MS, retryCount: 1 }) })
        : rpc;
    this.profile = networkProfile(config);
  }

  async settlementOf(payment: PaymentPayload, transaction?: string | null): Promise<SettlementState> {
    const auth = payment.payload.authorization;
    const from = auth.from as `0x${string}`;
    const nonce = auth.nonce as `0x${string}`;
    if (transaction) {
      const receipt = await this.reader.getTransactionReceipt({ hash: transaction as `0x${string}` }).catch((e: unknown) => {
        // Not mined (yet, or dropped): the nonce's state below decides.
        if (e instanceof BaseError && e.walk((err) => err instanceof TransactionReceiptNotFoundError)) return null;
        throw e;
      });
      if (receipt?.status === 'success' && this.transfers(receipt.logs, from, nonce)) return { state: 'settled', transaction: receipt.transactionHash };
    }
    const used = await this.reader.readContract({ address: this.profile.asset, abi: EIP3009_ABI, functionName: 'authorizationState', args: [from, nonce] });
    if (!used) {
      // A transfer is valid while the block's time is before validBefore; every later block is later still.
      const latest = await this.reader.getBlock({ blockTag: 'latest' });
      return { state: 'open', expired: latest.timestamp >= BigInt(auth.validBefore) };
    }
    const head = await this.reader.getBlockNumber();
    const logs = await this.reader.getLogs({
      address: this.profile.asset,
      event: AUTHORIZATION_USED,
      args: { authorizer: from, nonce },
      fromBlock: head > LOG_LOOKBACK_BLOCKS ? head - LOG_LOOKBACK_BLOCKS : 0n,
      toBlock: head,
    });
    const found = logs.find((l) => l.transactionHash);
    return found ? { state: 'settled', transaction: found.transactionHash! } : { state: 'used' };
  }

  /** Whether a receipt's logs hold this token's AuthorizationUsed(from, nonce). */
  private transfers(logs: readonly { address: string; topics: readonly string[] }[], from: string, nonce: string): boolean {
    const topic = (v: string) => `0x${v.slice(2).toLowerCase().padStart(64, '0')}`;
    return logs.some(
      (l) =>
        l.address.toLowerCase() === this.profile.asset.toLowerCase() &&
        l.topics[0] === AUTHORIZATION_USED_TOPIC &&
        l.topics[1]?.toLowerCase() === topic(from) &&
        l.topics[2]?.toLowerCase() === topic(nonce),
    );
  }
}

const AUTHORIZATION_USED = EIP3009_ABI[3];
const AUTHORIZATION_USED_TOPIC = toEventSelector(AUTHORIZATION_USED);

/**
 * Self-settlement (X402_RPC_URL + X402_SETTLER_PRIVATE_KEY): the service is its own facilitator.
 * Before the tool runs it reads the payer's token balance and the authorization's state from the
 * chain; after success it submits `transferWithAuthorization` (simulated first, so a transfer that
 * would revert is never sent), waits for X402_CONFIRMATIONS blocks and returns the transaction hash.
 * Submissions are serialised so concurrent settlements never race for the settler's account nonce
 * (one settler key per API process; see the README).
 */
export class ChainSettler implements PaymentSettler {
  readonly mode = 'self' as const;
  private readonly profile: NetworkProfile;
  private readonly chain: Chain;
  private readonly account: PrivateKeyAccount;
  private readonly reader: PublicClient;
  private readonly writer: WalletClient;
  private submitting: Promise<unknown> = Promise.resolve();
  /** Reads what became of a payment through the same client (the payment reconciler). */
  readonly lookup: ChainLookup;

  constructor(private readonly config: Config) {
    this.profile = networkProfile(config);
    const rpc = config.X402_RPC_URL!;
    this.chain = chainAt(this.profile, rpc);
    // The key stays inside the account object: never logged, never in an error message.
    this.account = privateKeyToAccount(config.X402_SETTLER_PRIVATE_KEY as `0x${string}`);
    const transport = http(rpc, { timeout: READ_TIMEOUT_MS, retryCount: 1 });
    this.reader = createPublicClient({ chain: this.chain, transport });
    this.writer = createWalletClient({ chain: this.chain, transport, account: this.account });
    this.lookup = new ChainLookup(config, this.reader);
  }

  /** The chain must be the one X402_NETWORK names, hold the token, and the settler must have gas. */
  async start(): Promise<void> {
    const where = `the chain at X402_RPC_URL`;
    let chainId: number, code: string | undefined, gas: bigint;
    try {
      [chainId, code, gas] = await Promise.all([
        this.reader.getChainId(),
        this.reader.getCode({ address: this.profile.asset }),
        this.reader.getBalance({ address: this.account.address }),
      ]);
    } catch {
      throw new SettlerStartupError(`cannot reach ${where} (self-settlement reads the payer's balance and submits transfers there)`);
    }
    if (chainId !== this.profile.chainId) {
      throw new SettlerStartupError(`${where} is chain ${chainId}, but X402_NETWORK=${this.profile.network} is chain ${this.profile.chainId}`);
    }
    if (!code || code === '0x') throw new SettlerStartupError(`${where} has no token contract at ${this.profile.asset} (X402_ASSET_ADDRESS)`);
    if (gas === 0n) {
      throw new SettlerStartupError(
        `the settler account ${this.account.address} (X402_SETTLER_PRIVATE_KEY) has no ETH on chain ${chainId} to pay for settlement gas`,
      );
    }
  }

  /** Funds and authorization state, read from the chain before any work is done. */
  async verify(payment: PaymentPayload): Promise<VerifyResult> {
    const auth = payment.payload.authorization;
    const from = auth.from as `0x${string}`;
    let balance: bigint, used: boolean;
    try {
      [balance, used] = await Promise.all([
        this.reader.readContract({ address: this.profile.asset, abi: EIP3009_ABI, functionName: 'balanceOf', args: [from] }),
        this.reader.readContract({
          address: this.profile.asset,
          abi: EIP3009_ABI,
          functionName: 'authorizationState',
          args: [from, auth.nonce as `0x${string}`],
        }),
      ]);
    } catch {
      return { isValid: false, invalidReason: RPC_UNREACHABLE, payer: auth.from };
    }
    if (used) return { isValid: false, invalidReason: NONCE_USED_ON_CHAIN, payer: auth.from };
    if (balance < BigInt(auth.value)) return { isValid: false, invalidReason: INSUFFICIENT_FUNDS, payer: auth.from };
    return { isValid: true, payer: auth.from };
  }

  async settle(payment: PaymentPayload, _requirements: PaymentRequirements, _v2?: unknown, hooks?: SettleHooks): Promise<SettleResult> {
    const auth = payment.payload.authorization;
    const failed = (errorReason: string, transaction = ''): SettleResult => ({
      success: false,
      transaction,
      network: this.profile.network,
      payer: auth.from,
      errorReason,
    });
    const sig = parseSignature(payment.payload.signature as `0x${string}`);
    const v = Number(sig.v ?? BigInt(sig.yParity + 27));
    const args = [
      auth.from as `0x${string}`,
      auth.to as `0x${string}`,
      BigInt(auth.value),
      BigInt(auth.validAfter),
      BigInt(auth.validBefore),
      auth.nonce as `0x${string}`,
      v,
      sig.r,
      sig.s,
    ] as const;

    let hash: `0x${string}`;
    try {
      hash = await this.serially(async () => {
        // Simulated first: funds moved away since verify, or the nonce used elsewhere, revert here
        // without spending gas, and nothing is sent.
        const { request } = await this.reader.simulateContract({
          account: this.account,
          address: this.profile.asset,
          abi: EIP3009_ABI,
          functionName: 'transferWithAuthorization',
          args,
        });
        return this.writer.writeContract(request);
      });
    } catch (e) {
      return failed(revertReason(e) ?? RPC_UNREACHABLE);
    }
    // Recorded before waiting: should this process die now, the receipt tells the reconciler what happened.
    await hooks?.submitted?.(hash);
    try {
      const receipt = await this.reader.waitForTransactionReceipt({
        hash,
        confirmations: this.config.X402_CONFIRMATIONS,
        timeout: this.config.X402_SETTLE_TIMEOUT_MS,
      });
      if (receipt.status !== 'success') return failed(TRANSACTION_REVERTED, hash);
    } catch {
      // Sent but not confirmed in time: it may still be mined. The hash goes on the payment record.
      return failed(SETTLEMENT_UNCONFIRMED, hash);
    }
    return { success: true, transaction: hash, network: this.profile.network, payer: auth.from };
  }

  /** One submission at a time: each takes the account's next nonce from the node after the last was sent. */
  private serially<T>(f: () => Promise<T>): Promise<T> {
    const run = this.submitting.then(f, f);
    this.submitting = run.catch(() => undefined);
    return run;
  }
}

/** `transaction_reverted: <reason>` when the simulation reverted, undefined for any other failure. */
function revertReason(e: unknown): string | undefined {
  if (!(e instanceof BaseError)) return undefined;
  const revert = e.walk((err) => err instanceof ContractFunctionRevertedError);
  if (!(revert instanceof ContractFunctionRevertedError)) return undefined;
  const reason = revert.reason ?? revert.shortMessage;
  return `${TRANSACTION_REVERTED}: ${reason}`.slice(0, 300);
}
