// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @title TestUSDC
/// @notice A minimal USDC look-alike for local chains in tests: ERC-20 plus EIP-3009
///         transferWithAuthorization with the same type hash, domain and checks as Circle's FiatToken v2,
///         so x402 clients that sign for USDC at its public address can pay a local chain unmodified.
/// @dev Never deployed with a constructor: the harness places the runtime code at USDC's address with
///      anvil_setCode and then calls initialize(), so all state, including the owner, lives in storage.
///      The EIP-712 domain is computed on every call from the stored name and version, the chain id and
///      address(this), so it is right wherever the code is placed.
contract TestUSDC {
    bytes32 public constant EIP712_DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 public constant TRANSFER_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    );

    /// @dev Upper bound of `s` in a canonical (low-s) secp256k1 signature, as in OpenZeppelin's ECDSA.
    uint256 private constant HALF_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0;

    string private _name;
    string private _version;
    uint8 private _decimals;
    bool private _initialized;
    address public owner;

    uint256 private _totalSupply;
    mapping(address => uint256) private _balances;
    mapping(address => mapping(address => uint256)) private _allowances;
    mapping(address => mapping(bytes32 => bool)) private _authorizationStates;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);

    /// @notice One-time setup in place of a constructor; the caller becomes the owner (the only minter).
    function initialize(string calldata name_, string calldata version_, uint8 decimals_) external {
        require(!_initialized, "TestUSDC: already initialized");
        _initialized = true;
        _name = name_;
        _version = version_;
        _decimals = decimals_;
        owner = msg.sender;
    }

    // ---- ERC-20 ----

    function name() external view returns (string memory) {
        return _name;
    }

    function symbol() external pure returns (string memory) {
        return "USDC";
    }

    /// @notice The EIP-712 domain version ("2" for USDC), readable like FiatToken's version().
    function version() external view returns (string memory) {
        return _version;
    }

    function decimals() external view returns (uint8) {
        return _decimals;
    }

    function totalSupply() external view returns (uint256) {
        return _totalSupply;
    }

    function balanceOf(address account) external view returns (uint256) {
        return _balances[account];
    }

    function allowance(address holder, address spender) external view returns (uint256) {
        return _allowances[holder][spender];
    }

    function transfer(address to, uint256 value) external returns (bool) {
        _transfer(msg.sender, to, value);
        return true;
    }

    function approve(address spender, uint256 value) external returns (bool) {
        require(spender != address(0), "ERC20: approve to the zero address");
        _allowances[msg.sender][spender] = value;
        emit Approval(msg.sender, spender, value);
        return true;
    }

    function transferFrom(address from, address to, uint256 value) external returns (bool) {
        uint256 allowed = _allowances[from][msg.sender];
        require(value <= allowed, "ERC20: transfer amount exceeds allowance");
        _allowances[from][msg.sender] = allowed - value;
        _transfer(from, to, value);
        return true;
    }

    function mint(address to, uint256 amount) external returns (bool) {
        require(msg.sender == owner, "TestUSDC: caller is not the owner");
        require(to != address(0), "TestUSDC: mint to the zero address");
        _totalSupply += amount;
        _balances[to] += amount;
        emit Transfer(address(0), to, amount);
        return true;
    }

    // ---- EIP-712 / EIP-3009 ----

    function DOMAIN_SEPARATOR() public view returns (bytes32) {
        return keccak256(
            abi.encode(
                EIP712_DOMAIN_TYPEHASH,
                keccak256(bytes(_name)),
                keccak256(bytes(_version)),
                block.chainid,
                address(this)
            )
        );
    }

    /// @notice Whether `authorizer` has used `nonce` (true once an authorization with it has executed).
    function authorizationState(address authorizer, bytes32 nonce) external view returns (bool) {
        return _authorizationStates[authorizer][nonce];
    }

    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) external {
        _transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v, r, s);
    }

    /// @notice The FiatToken v2.2 overload taking a 65-byte signature (r, s, v).
    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external {
        require(signature.length == 65, "FiatTokenV2: invalid signature");
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        _transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v, r, s);
    }

    function _transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        uint8 v,
        bytes32 r,
        bytes32 s
    ) private {
        require(block.timestamp > validAfter, "FiatTokenV2: authorization is not yet valid");
        require(block.timestamp < validBefore, "FiatTokenV2: authorization is expired");
        require(!_authorizationStates[from][nonce], "FiatTokenV2: authorization is used or canceled");

        bytes32 structHash = keccak256(
            abi.encode(TRANSFER_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce)
        );
        bytes32 digest = keccak256(abi.encodePacked("\x19\x01", DOMAIN_SEPARATOR(), structHash));
        require(_recover(digest, v, r, s) == from, "FiatTokenV2: invalid signature");

        _authorizationStates[from][nonce] = true;
        emit AuthorizationUsed(from, nonce);
        _transfer(from, to, value);
    }

    /// @dev ecrecover with OpenZeppelin ECDSA's malleability rules: low s only, v of 27 or 28, and a
    ///      failed recovery (address(0)) never matches, even when `from` is the zero address.
    function _recover(bytes32 digest, uint8 v, bytes32 r, bytes32 s) private pure returns (address) {
        require(uint256(s) <= HALF_ORDER, "FiatTokenV2: invalid signature");
        require(v == 27 || v == 28, "FiatTokenV2: invalid signature");
        address signer = ecrecover(digest, v, r, s);
        require(signer != address(0), "FiatTokenV2: invalid signature");
        return signer;
    }

    function _transfer(address from, address to, uint256 value) private {
        require(from != address(0), "ERC20: transfer from the zero address");
        require(to != address(0), "ERC20: transfer to the zero address");
        uint256 balance = _balances[from];
        require(value <= balance, "ERC20: transfer amount exceeds balance");
        unchecked {
            _balances[from] = balance - value;
        }
        _balances[to] += value;
        emit Transfer(from, to, value);
    }
}
