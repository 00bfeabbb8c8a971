import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { domainSeparator, keccak256, parseAbi, parseSignature, serializeSignature, toHex, type Address, type Hex } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { TRANSFER_WITH_AUTHORIZATION_TYPES } from '../../src/pay/x402/verify.js';
import { DEPLOYER_KEY, MULTICALL3_ADDRESS, TEST_USDC_ABI, USDC_ADDRESS, compileContracts, startChain, type Chain, type Wallet } from '../helpers/chain.js';

/**
 * The local chain harness is real: anvil at Base Sepolia's chain id, TestUSDC at USDC's address with
 * the EIP-712 domain x402 clients sign for, EIP-3009 transfers that move balances and refuse what
 * FiatToken refuses, and Multicall3 where public chains have it.
 */

// The typed data x402 clients sign, as the service verifies it.
const TYPES = TRANSFER_WITH_AUTHORIZATION_TYPES;

// secp256k1 group order: s' = N - s (with v flipped) is the malleable twin of a signature.
const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;

interface Authorization {
  from: Address;
  to: Address;
  value: bigint;
  validAfter: bigint;
  validBefore: bigint;
  nonce: Hex;
}

let chain: Chain;
let payer: Wallet;
let payTo: Address;

const nowSeconds = () => BigInt(Math.floor(Date.now() / 1000));

/** An authorization from the payer to payTo, valid from ten minutes ago for an hour, like x402 clients make. */
function authorization(overrides: Partial<Authorization> = {}): Authorization {
  return {
    from: payer.address,
    to: payTo,
    value: 10_000n,
    validAfter: nowSeconds() - 600n,
    validBefore: nowSeconds() + 3600n,
    nonce: toHex(randomBytes(32)),
    ...overrides,
  };
}

function sign(auth: Authorization, privateKey: Hex = payer.privateKey): Promise<Hex> {
  return privateKeyToAccount(privateKey).signTypedData({
    domain: { name: 'USDC', version: '2', chainId: 84532, verifyingContract: USDC_ADDRESS },
    types: TYPES,
    primaryType: 'TransferWithAuthorization',
    message: auth,
  });
}

/** Submitted by the deployer, a third party, as a facilitator would: the (v, r, s) overload. */
async function submit(auth: Authorization, signature: Hex): Promise<Hex> {
  const { r, s, v } = parseSignature(signature);
  const hash = await chain.walletClient(DEPLOYER_KEY).writeContract({
    address: USDC_ADDRESS,
    abi: TEST_USDC_ABI,
    functionName: 'transferWithAuthorization',
    args: [auth.from, auth.to, auth.value, auth.validAfter, auth.validBefore, auth.nonce, Number(v), r, s],
  });
  const receipt = await chain.publicClient.waitForTransactionReceipt({ hash });
  expect(receipt.status).toBe('success');
  return hash;
}

beforeAll(async () => {
  chain = await startChain();
  payer = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  await chain.mint(payer.address, 1_000_000n);
});

afterAll(async () => {
  await chain?.stop();
});

describe('chain harness', () => {
  it('runs Base Sepolia chain id with TestUSDC initialised at USDC address', async () => {
    expect(await chain.publicClient.getChainId()).toBe(84532);
    expect(chain.chainId).toBe(84532);
    expect(chain.usdc).toBe('0x036CbD53842c5426634e7929541eC2318f3dCF7e');
    const read = <F extends 'name' | 'symbol' | 'version' | 'decimals' | 'owner'>(functionName: F) =>
      chain.publicClient.readContract({ address: USDC_ADDRESS, abi: TEST_USDC_ABI, functionName });
    expect(await read('name')).toBe('USDC');
    expect(await read('symbol')).toBe('USDC');
    expect(await read('version')).toBe('2');
    expect(await read('decimals')).toBe(6);
    expect(await read('owner')).toBe(chain.deployer.address);
  });

  it('computes the EIP-712 domain and type hash x402 clients sign with', async () => {
    const onChain = await chain.publicClient.readContract({
      address: USDC_ADDRESS,
      abi: TEST_USDC_ABI,
      functionName: 'DOMAIN_SEPARATOR',
    });
    expect(onChain).toBe(domainSeparator({ domain: { name: 'USDC', version: '2', chainId: 84532, verifyingContract: USDC_ADDRESS } }));
    const typeHash = await chain.publicClient.readContract({
      address: USDC_ADDRESS,
      abi: TEST_USDC_ABI,
      functionName: 'TRANSFER_WITH_AUTHORIZATION_TYPEHASH',
    });
    expect(typeHash).toBe(
      keccak256(toHex('TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)')),
    );
  });

  it('refuses initialize twice and mint by anyone but the owner', async () => {
    const stranger = chain.walletClient(payer.privateKey);
    await expect(stranger.writeContract({ address: USDC_ADDRESS, abi: TEST_USDC_ABI, functionName: 'initialize', args: ['X', '1', 18] })).rejects.toThrow(
      /already initialized/,
    );
    await expect(stranger.writeContract({ address: USDC_ADDRESS, abi: TEST_USDC_ABI, functionName: 'mint', args: [payer.address, 1n] })).rejects.toThrow(
      /not the owner/,
    );
  });

  it('executes a signed TransferWithAuthorization submitted by a third party, once', async () => {
    const before = { payer: await chain.balanceOf(payer.address), payTo: await chain.balanceOf(payTo) };
    const auth = authorization({ value: 250_000n });
    const signature = await sign(auth);
    expect(await chain.authorizationState(payer.address, auth.nonce)).toBe(false);

    const hash = await submit(auth, signature);

    expect(await chain.balanceOf(payer.address)).toBe(before.payer - 250_000n);
    expect(await chain.balanceOf(payTo)).toBe(before.payTo + 250_000n);
    expect(await chain.authorizationState(payer.address, auth.nonce)).toBe(true);
    const receipt = await chain.publicClient.getTransactionReceipt({ hash });
    const used = receipt.logs.find((l) => l.topics[0] === keccak256(toHex('AuthorizationUsed(address,bytes32)')));
    expect(used?.topics[2]).toBe(auth.nonce);

    // The same authorization again: the nonce is spent.
    await expect(submit(auth, signature)).rejects.toThrow(/authorization is used or canceled/);
    expect(await chain.balanceOf(payTo)).toBe(before.payTo + 250_000n);
  });

  it('refuses more than the balance, expired, not yet valid, wrong-signer and high-s authorizations', async () => {
    const balance = await chain.balanceOf(payer.address);

    const tooMuch = authorization({ value: balance + 1n });
    await expect(submit(tooMuch, await sign(tooMuch))).rejects.toThrow(/transfer amount exceeds balance/);

    const expired = authorization({ validAfter: 0n, validBefore: nowSeconds() - 60n });
    await expect(submit(expired, await sign(expired))).rejects.toThrow(/authorization is expired/);

    const early = authorization({ validAfter: nowSeconds() + 3600n, validBefore: nowSeconds() + 7200n });
    await expect(submit(early, await sign(early))).rejects.toThrow(/authorization is not yet valid/);

    // Signed by someone else, claiming to be the payer.
    const forged = authorization();
    const other = await chain.newWallet();
    await expect(submit(forged, await sign(forged, other.privateKey))).rejects.toThrow(/invalid signature/);

    // The malleable twin of a valid signature recovers the payer too; OpenZeppelin-style checks refuse it.
    const twin = authorization();
    const { r, s, yParity } = parseSignature(await sign(twin));
    const highS = serializeSignature({ r, s: toHex(SECP256K1_N - BigInt(s), { size: 32 }), yParity: 1 - yParity });
    await expect(submit(twin, highS)).rejects.toThrow(/invalid signature/);

    expect(await chain.balanceOf(payer.address)).toBe(balance);
    for (const a of [tooMuch, expired, early, forged, twin]) {
      expect(await chain.authorizationState(payer.address, a.nonce)).toBe(false);
    }
  });

  it('accepts the bytes-signature overload', async () => {
    const before = await chain.balanceOf(payTo);
    const auth = authorization({ value: 1_234n });
    const hash = await chain.walletClient(DEPLOYER_KEY).writeContract({
      address: USDC_ADDRESS,
      abi: TEST_USDC_ABI,
      functionName: 'transferWithAuthorization',
      args: [auth.from, auth.to, auth.value, auth.validAfter, auth.validBefore, auth.nonce, await sign(auth)],
    });
    expect((await chain.publicClient.waitForTransactionReceipt({ hash })).status).toBe('success');
    expect(await chain.balanceOf(payTo)).toBe(before + 1_234n);
    expect(await chain.authorizationState(payer.address, auth.nonce)).toBe(true);
  });

  it('has Multicall3 at its canonical address', async () => {
    const blockNumber = await chain.publicClient.readContract({
      address: MULTICALL3_ADDRESS,
      abi: parseAbi(['function getBlockNumber() view returns (uint256)']),
      functionName: 'getBlockNumber',
    });
    expect(blockNumber).toBe(await chain.publicClient.getBlockNumber());
    // viem batches through it because the harness registers it on the chain.
    const [balance, name] = await chain.publicClient.multicall({
      contracts: [
        { address: USDC_ADDRESS, abi: TEST_USDC_ABI, functionName: 'balanceOf', args: [payer.address] },
        { address: USDC_ADDRESS, abi: TEST_USDC_ABI, functionName: 'name' },
      ],
      allowFailure: false,
    });
    expect(balance).toBe(await chain.balanceOf(payer.address));
    expect(name).toBe('USDC');
  });

  it('funds new wallets, moves funds away, and holds transactions pending with automine off', async () => {
    const holder = await chain.newWallet();
    expect(await chain.publicClient.getBalance({ address: holder.address })).toBe(10n ** 18n);
    await chain.mint(holder.address, 500n);
    const sink = (await chain.newWallet()).address;

    await chain.transferAway(holder.privateKey, sink, 200n);
    expect(await chain.balanceOf(holder.address)).toBe(300n);

    await chain.setAutomine(false);
    try {
      const hash = await chain.transferAway(holder.privateKey, sink, 300n);
      expect(await chain.balanceOf(holder.address)).toBe(300n); // still pending
      await chain.mine();
      expect((await chain.publicClient.getTransactionReceipt({ hash })).status).toBe('success');
      expect(await chain.balanceOf(holder.address)).toBe(0n);
      expect(await chain.balanceOf(sink)).toBe(500n);
    } finally {
      await chain.setAutomine(true);
    }
  });

  it('exports an ABI that matches the compiled contract', async () => {
    const { TestUSDC } = await compileContracts();
    const signature = (e: { type: string; name?: string; inputs?: readonly { type: string }[] }) =>
      `${e.type} ${e.name}(${(e.inputs ?? []).map((i) => i.type).join(',')})`;
    const compiled = new Set(TestUSDC.abi.map(signature));
    for (const entry of TEST_USDC_ABI) expect(compiled).toContain(signature(entry));
  });

  it('stops anvil, idempotently', async () => {
    const other = await startChain({ chainId: 31337 });
    expect(await other.publicClient.getChainId()).toBe(31337);
    expect(await other.balanceOf(other.deployer.address)).toBe(0n);
    await Promise.all([other.stop(), other.stop()]);
    await other.stop();
    // Plain fetch: viem's transport would retry with backoff before giving up.
    await expect(fetch(other.rpcUrl, { method: 'POST' })).rejects.toThrow();
  });
});
