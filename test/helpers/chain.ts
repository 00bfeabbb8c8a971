import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  createPublicClient,
  createTestClient,
  createWalletClient,
  defineChain,
  http,
  parseAbi,
  parseEther,
  type Abi,
  type Address,
  type Chain as ViemChain,
  type Hex,
  type PublicClient,
  type TestClient,
  type Transport,
  type WalletClient,
} from 'viem';
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from 'viem/accounts';

/**
 * A real local EVM chain for x402 pay-per-call tests: anvil on a free port with a USDC look-alike
 * (contracts/TestUSDC.sol, EIP-3009) placed at Base Sepolia's USDC address and Multicall3 at its
 * canonical address. x402 clients sign for the assets in their built-in tables, so putting the token
 * where they expect it lets unmodified clients pay against the chain. Contracts are compiled with
 * solc-js on first use and cached in memory and under node_modules/.cache.
 */

/** Base Sepolia's USDC: the asset x402 clients use for `base-sepolia` / eip155:84532. */
export const USDC_ADDRESS: Address = '0x036CbD53842c5426634e7929541eC2318f3dCF7e';
/** Multicall3's address on every public chain (viem and x402 clients may call it). */
export const MULTICALL3_ADDRESS: Address = '0xcA11bde05977b3631167028862bE2a173976CA11';
export const BASE_SEPOLIA_CHAIN_ID = 84532;
/** Anvil's (and Hardhat's) first development key. It becomes the token's owner, the only minter. */
export const DEPLOYER_KEY: Hex = '0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80';

/** What a settler and the tests call on TestUSDC (the same signatures as Circle's FiatToken v2.2). */
export const TEST_USDC_ABI = parseAbi([
  'function name() view returns (string)',
  'function symbol() view returns (string)',
  'function version() view returns (string)',
  'function decimals() view returns (uint8)',
  'function totalSupply() view returns (uint256)',
  'function balanceOf(address account) view returns (uint256)',
  'function allowance(address holder, address spender) view returns (uint256)',
  'function transfer(address to, uint256 value) returns (bool)',
  'function approve(address spender, uint256 value) returns (bool)',
  'function transferFrom(address from, address to, uint256 value) returns (bool)',
  'function mint(address to, uint256 amount) returns (bool)',
  'function initialize(string name, string version, uint8 decimals)',
  'function owner() view returns (address)',
  'function DOMAIN_SEPARATOR() view returns (bytes32)',
  'function TRANSFER_WITH_AUTHORIZATION_TYPEHASH() view returns (bytes32)',
  'function authorizationState(address authorizer, bytes32 nonce) view returns (bool)',
  'function transferWithAuthorization(address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce, uint8 v, bytes32 r, bytes32 s)',
  'function transferWithAuthorization(address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce, bytes signature)',
  'event Transfer(address indexed from, address indexed to, uint256 value)',
  'event Approval(address indexed owner, address indexed spender, uint256 value)',
  'event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce)',
]);

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const requireFromRoot = createRequire(path.join(ROOT, 'package.json'));

// ---- Contracts ----

export interface CompiledContract {
  abi: Abi;
  /** Runtime code (what anvil_setCode places), not creation code: nothing here runs a constructor. */
  runtime: Hex;
}
export interface CompiledContracts {
  TestUSDC: CompiledContract;
  Multicall3: CompiledContract;
}

const SOURCES = ['TestUSDC.sol', 'Multicall3.sol'] as const;
// cancun: what Base runs and anvil accepts; solc 0.8.37's default (osaka) is newer than some chains.
const SOLC_SETTINGS = {
  optimizer: { enabled: true, runs: 200 },
  evmVersion: 'cancun',
  outputSelection: { '*': { '*': ['abi', 'evm.deployedBytecode.object'] } },
};

let compiled: Promise<CompiledContracts> | undefined;

/**
 * Both contracts' ABI and runtime code, compiled once per process. solc-js takes a couple of seconds
 * (WebAssembly, single-threaded), so the result is also kept on disk keyed by a hash of the sources,
 * settings and solc version; a cache that cannot be read or written is just skipped.
 */
export function compileContracts(): Promise<CompiledContracts> {
  compiled ??= loadOrCompile();
  return compiled;
}

async function loadOrCompile(): Promise<CompiledContracts> {
  const sources = Object.fromEntries(SOURCES.map((f) => [f, { content: readFileSync(path.join(ROOT, 'contracts', f), 'utf8') }]));
  // The version from package.json, so a cache hit never loads the compiler.
  const solcVersion = (requireFromRoot('solc/package.json') as { version: string }).version;
  const key = createHash('sha256').update(JSON.stringify({ solcVersion, SOLC_SETTINGS, sources })).digest('hex');
  const cacheDir = path.join(ROOT, 'node_modules', '.cache', 'tollgate-contracts');
  const cacheFile = path.join(cacheDir, `${key}.json`);
  try {
    return JSON.parse(readFileSync(cacheFile, 'utf8')) as CompiledContracts;
  } catch {
    // Not cached yet (or unreadable): compile.
  }

  const { default: solc } = await import('solc');
  const input = { language: 'Solidity', sources, settings: SOLC_SETTINGS };
  const output = JSON.parse(solc.compile(JSON.stringify(input))) as {
    errors?: { severity: string; formattedMessage: string }[];
    contracts: Record<string, Record<string, { abi: Abi; evm: { deployedBytecode: { object: string } } }>>;
  };
  const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
  if (errors.length > 0) throw new Error(`solc: ${errors.map((e) => e.formattedMessage).join('\n')}`);
  const pick = (file: string, name: string): CompiledContract => {
    const c = output.contracts[file]?.[name];
    if (!c) throw new Error(`solc produced no ${name} in ${file}`);
    return { abi: c.abi, runtime: `0x${c.evm.deployedBytecode.object}` };
  };
  const result: CompiledContracts = {
    TestUSDC: pick('TestUSDC.sol', 'TestUSDC'),
    Multicall3: pick('Multicall3.sol', 'Multicall3'),
  };

  try {
    mkdirSync(cacheDir, { recursive: true });
    // Write then rename, so a test file starting in parallel never reads half a file.
    const tmp = `${cacheFile}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify(result));
    renameSync(tmp, cacheFile);
  } catch {
    // Read-only node_modules and the like: the in-memory copy is enough.
  }
  return result;
}

// ---- Anvil ----

/**
 * The platform's anvil binary itself rather than node_modules/.bin/anvil, which is a Node wrapper:
 * killing the wrapper hard would leave the real anvil running. Falls back to the wrapper (it forwards
 * SIGTERM) when the platform package is not where @foundry-rs/anvil keeps it.
 */
function anvilPath(): string {
  const arch = process.arch === 'x64' ? 'amd64' : process.arch;
  const exe = process.platform === 'win32' ? 'anvil.exe' : 'anvil';
  try {
    const wrapper = createRequire(requireFromRoot.resolve('@foundry-rs/anvil/package.json'));
    return wrapper.resolve(`@foundry-rs/anvil-${process.platform}-${arch}/bin/${exe}`);
  } catch {
    return path.join(ROOT, 'node_modules', '.bin', exe);
  }
}

/**
 * Runs anvil under a small sh guard that holds the read end of a pipe from this process: when this
 * process dies, however it dies (a vitest worker killed with SIGKILL included), the pipe reaches EOF
 * and the guard stops anvil. Closing our end is also how stop() asks for a clean shutdown.
 */
const GUARD = [
  'trap \'kill "$pid" "$watch" 2>/dev/null; exit 143\' TERM INT',
  'exec 3<&0',
  '"$@" </dev/null 3<&- &',
  'pid=$!',
  '{ read _ <&3; kill "$pid" 2>/dev/null; } &',
  'watch=$!',
  'exec 3<&-',
  'wait "$pid"',
  'code=$?',
  'kill "$watch" 2>/dev/null',
  'exit "$code"',
].join('\n');

const running = new Set<ChildProcess>();
let exitHookInstalled = false;

/** Belt and braces next to the guard: anvils still running when the process exits are stopped. */
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const child of running) child.kill('SIGTERM');
  });
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

async function rpc(url: string, method: string, params: unknown[] = []): Promise<unknown> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
  });
  const body = (await res.json()) as { result?: unknown; error?: { message: string } };
  if (body.error) throw new Error(`${method}: ${body.error.message}`);
  return body.result;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Spawns anvil on `port` and resolves once it answers eth_chainId; rejects with its stderr otherwise. */
async function launchAnvil(port: number, chainId: number): Promise<{ child: ChildProcess; exited: Promise<void> }> {
  const args = ['--chain-id', String(chainId), '--port', String(port), '--host', '127.0.0.1', '--quiet'];
  const bin = anvilPath();
  const child =
    process.platform === 'win32'
      ? spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] })
      : spawn('/bin/sh', ['-c', GUARD, 'anvil-guard', bin, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
  running.add(child);
  installExitHook();
  let output = '';
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  // The guard never reads what we write; an EPIPE after anvil died is not an error worth crashing on.
  child.stdin?.on('error', () => {});
  let exitCode: number | null | undefined;
  const exited = new Promise<void>((resolve) => {
    child.once('exit', (code, signal) => {
      exitCode = code ?? (signal ? -1 : null);
      running.delete(child);
      resolve();
    });
    child.once('error', (err) => {
      output += String(err);
      exitCode = -1;
      running.delete(child);
      resolve();
    });
  });

  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (exitCode !== undefined) throw new AnvilStartError(`anvil exited (${exitCode}) before answering:\n${output}`);
    try {
      const id = await rpc(url, 'eth_chainId');
      if (Number(id) === chainId) return { child, exited };
    } catch {
      // Not listening yet.
    }
    await sleep(50);
  }
  child.stdin?.end();
  child.kill('SIGTERM');
  throw new AnvilStartError(`anvil did not answer eth_chainId on ${url} within 20 s:\n${output}`);
}

class AnvilStartError extends Error {}

// ---- The chain ----

export interface Wallet {
  privateKey: Hex;
  address: Address;
  account: PrivateKeyAccount;
}

export interface Chain {
  rpcUrl: string;
  chainId: number;
  /** viem chain definition for this chain (Multicall3 registered, so viem's multicall works). */
  chain: ViemChain;
  /** TestUSDC's address: Base Sepolia's USDC. */
  usdc: Address;
  /** Anvil's first dev account: funded with ETH, owner (minter) of TestUSDC. */
  deployer: PrivateKeyAccount;
  publicClient: PublicClient<Transport, ViemChain>;
  /** anvil_* / evm_* methods (setBalance, setCode, impersonation, time travel). */
  testClient: TestClient<'anvil', Transport, ViemChain>;
  walletClient(privateKey: Hex): WalletClient<Transport, ViemChain, PrivateKeyAccount>;
  /** A fresh random key with 1 ETH, so it can pay gas itself; no USDC until mint(). */
  newWallet(): Promise<Wallet>;
  /**
   * Mints `atomicAmount` (6 decimals) to `to`. Like every write below: returns the transaction hash,
   * after its receipt while automine is on (throwing if it reverted), at once while it is off.
   */
  mint(to: Address, atomicAmount: bigint): Promise<Hex>;
  balanceOf(address: Address): Promise<bigint>;
  authorizationState(authorizer: Address, nonce: Hex): Promise<boolean>;
  /** A plain ERC-20 transfer signed by the holder: moves funds away between verify and settle. */
  transferAway(fromPrivateKey: Hex, to: Address, amount: bigint): Promise<Hex>;
  /** Off: transactions wait in the mempool until mine(), so a test can hold a settlement pending. */
  setAutomine(on: boolean): Promise<void>;
  /** Mines one block with whatever is pending. */
  mine(): Promise<void>;
  /** Stops anvil and waits for it to exit. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Starts anvil (chain id 84532 unless told otherwise), places TestUSDC at USDC's address initialised
 * as ("USDC", "2", 6) with the deployer as minter, and Multicall3 at its canonical address.
 */
export async function startChain(opts: { chainId?: number } = {}): Promise<Chain> {
  const chainId = opts.chainId ?? BASE_SEPOLIA_CHAIN_ID;
  // Compile while anvil starts: the two take about the same time on a cold cache.
  const contracts = compileContracts();
  contracts.catch(() => {}); // awaited below; keeps an early anvil failure from leaving it unhandled

  // A port found free can be taken before anvil binds it; try again with another.
  let launched: Awaited<ReturnType<typeof launchAnvil>> | undefined;
  let port = 0;
  for (let attempt = 1; !launched; attempt++) {
    port = await freePort();
    try {
      launched = await launchAnvil(port, chainId);
    } catch (err) {
      if (attempt >= 3 || !(err instanceof AnvilStartError) || !/in use/i.test(err.message)) throw err;
    }
  }
  const { child, exited } = launched;

  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.stdin?.end(); // the guard's cue to stop anvil
        if (process.platform === 'win32') child.kill();
        const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }
    })();
    return stopping;
  };

  try {
    const rpcUrl = `http://127.0.0.1:${port}`;
    const chain = defineChain({
      id: chainId,
      name: `anvil-${chainId}`,
      nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
      rpcUrls: { default: { http: [rpcUrl] } },
      contracts: { multicall3: { address: MULTICALL3_ADDRESS } },
    });
    // viem polls every 4 s by default; a local chain answers at once.
    const pollingInterval = 50;
    const transport = http(rpcUrl);
    const publicClient = createPublicClient({ chain, transport, pollingInterval });
    const testClient = createTestClient({ mode: 'anvil', chain, transport, pollingInterval });
    const walletClient = (privateKey: Hex) => createWalletClient({ account: privateKeyToAccount(privateKey), chain, transport, pollingInterval });
    const deployerWallet = walletClient(DEPLOYER_KEY);
    let automine = true;

    /** Waits for the receipt only while automine is on: otherwise the transaction is pending until mine(). */
    const settled = async (hash: Hex): Promise<Hex> => {
      if (!automine) return hash;
      const receipt = await publicClient.waitForTransactionReceipt({ hash });
      if (receipt.status !== 'success') throw new Error(`transaction ${hash} reverted`);
      return hash;
    };

    const { TestUSDC, Multicall3 } = await contracts;
    await testClient.setCode({ address: USDC_ADDRESS, bytecode: TestUSDC.runtime });
    await testClient.setCode({ address: MULTICALL3_ADDRESS, bytecode: Multicall3.runtime });
    await settled(
      await deployerWallet.writeContract({
        address: USDC_ADDRESS,
        abi: TEST_USDC_ABI,
        functionName: 'initialize',
        args: ['USDC', '2', 6],
      }),
    );

    return {
      rpcUrl,
      chainId,
      chain,
      usdc: USDC_ADDRESS,
      deployer: deployerWallet.account,
      publicClient,
      testClient,
      walletClient,
      async newWallet() {
        const privateKey = generatePrivateKey();
        const account = privateKeyToAccount(privateKey);
        await testClient.setBalance({ address: account.address, value: parseEther('1') });
        return { privateKey, address: account.address, account };
      },
      async mint(to, atomicAmount) {
        return settled(
          await deployerWallet.writeContract({
            address: USDC_ADDRESS,
            abi: TEST_USDC_ABI,
            functionName: 'mint',
            args: [to, atomicAmount],
          }),
        );
      },
      balanceOf: (address) => publicClient.readContract({ address: USDC_ADDRESS, abi: TEST_USDC_ABI, functionName: 'balanceOf', args: [address] }),
      authorizationState: (authorizer, nonce) =>
        publicClient.readContract({
          address: USDC_ADDRESS,
          abi: TEST_USDC_ABI,
          functionName: 'authorizationState',
          args: [authorizer, nonce],
        }),
      async transferAway(fromPrivateKey, to, amount) {
        return settled(
          await walletClient(fromPrivateKey).writeContract({
            address: USDC_ADDRESS,
            abi: TEST_USDC_ABI,
            functionName: 'transfer',
            args: [to, amount],
          }),
        );
      },
      async setAutomine(on) {
        await testClient.setAutomine(on);
        automine = on;
      },
      async mine() {
        await testClient.mine({ blocks: 1 });
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
