"""Records whose writer is proven: every record a hivemux process publishes is signed with its
service's key, and every consumer checks the signature before it admits the record (issue 28).

Why signatures and not broker users. On a real Kafka, SASL users with ACLs
(`bus.authorization.kafka_acls`) keep a service off the topics it may not write, but a record
still only *claims* its writer inside (``source``), and two services allowed to write one topic
(the allocator and the matcher both command executors) could speak for each other. The embedded
Tansu can neither help nor be made to: measured on its 0.6.0 build, SASL is offered only with
``--authentication``; ``tansu user create`` then cannot connect (the tool does not authenticate,
"early eof"), aiokafka's SCRAM exchange with it fails (no server signature), users live in the
memory store that a broker restart empties, and it has no ACLs at all. Signing holds the same
way on both brokers, survives the archive's restore (headers are archived), and binds each
record to a principal, not only each connection.

Why Ed25519 and not HMAC. With a shared HMAC key every verifier holds what it takes to forge:
each executor, on a node that runs users' programs, would hold the allocator's and the
matcher's keys. With Ed25519 a consumer holds public keys only (the keyring); a service's
private key is in one file its process alone can read. The cost is verification: ~50-120 us
per signature here, too much per telemetry record, so a publisher signs the root of a Merkle
tree of up to `LEAVES` records (one signature per publish of a batch), each record carrying
its path (33 bytes per level, at most 6 levels), and a consumer verifies each root once and
remembers every digest it proved under it, so a batch-mate's walk up stops at the first proven
node: per record, about two SHA-256 compressions (`benchmarks/bus_authorization.py`).

What is signed, per record (the leaf): SHA-256 over ``0x00`` and, each length-prefixed, the
topic, the signer's name, the key id, the record's key bytes and value bytes; interior nodes are
SHA-256 over ``0x01`` + left + right (the two prefixes keep a leaf from passing as a node); the
signature is over ``DOMAIN`` + the root. Headers: ``hivemux-signer`` (the signer's name) and
``hivemux-sig`` (key id 8 bytes, signature 64, then the path: per level ``L`` or ``R``, where the
sibling sits, and its 32-byte hash). The partition is not signed (the key places the record),
nor the offset (a copy of a record on the log is a duplicate with the same event id).

Signers and what they may claim (`covers`): a signer is a principal (``cell-allocator``) or a
principal and instance (``executor/node-01``, a node agent's own key). It may write records
whose ``source`` has its principal (or an alias its process writes: `KAFKA_USER`,
``predictor-store`` for ``predictor``, ``hivemux-up`` for ``cli``) and, if it names an
instance, that same instance. `bus.authorization` then judges the source as proven.

Keys on disk (`write_keys`, what `hivemux up` does in ``<workdir>/keys``; Kubernetes: one Secret
per service, deploy/kubernetes/signing-keys.md): ``<signer>.key``, mode 0600, JSON
``{signer: private key hex}`` (a test keyring holds several); ``keyring.json``, JSON
``{signer: [public key hex, ...]}`` (more than one: a rotation in progress). A process names
them with ``HIVEMUX_SIGNING_KEY`` and
``HIVEMUX_KEYRING`` (`settings.BusSettings`); `configure` loads them once (its entry point calls
it through `bus.connection.configure`). A process that configured none signs and verifies with
keys of its own, made at first use for every principal (in-process benchmarks and tools):
nothing outside it accepts its records, nor it theirs; a service process refuses to start so
(`observability.serve`).

Worked example: the allocator publishes 3 bindings in one batch: leaves h0, h1, h2; root
H(H(h0 h1) h2); one signature. h0's path is ``R``+h1, ``R``+h2; h2's is ``L``+H(h0 h1). A
consumer of h1's partition computes h1 from the record, walks ``L``+h0, ``R``+h2 to the root,
finds it unverified, verifies the signature with the allocator's public key for that key id,
and remembers the root: h0 and h2, if it reads them, cost two hashes each. The same bytes sent
with a plain producer carry no headers: "unsigned record".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ..errors import ConfigurationError
from .authorization import KAFKA_USER, SERVICES, WRITERS, principal_of

log = logging.getLogger("hivemux.bus.signing")

HEADER_SIGNER = "hivemux-signer"
HEADER_SIGNATURE = "hivemux-sig"
DOMAIN = b"hivemux-signed-records/1\x00"
LEAVES = 64  # records under one signature: a path of at most 6 levels (198 bytes)
_MAX_PATH = 33 * 6
_NONE = b"\xff\xff\xff\xff"  # a missing key or value, unlike an empty one
CLI_SIGNER = "cli"  # an operator's key: `hivemux` commands that publish (and `hivemux up`'s own records)
_CACHE_LIMIT = 65_536  # proven digests remembered (~7 MB); then forgotten all at once

Headers = list[tuple[str, bytes]]


def covers(signer: str, source: str) -> bool:
    """Whether a record signed by `signer` may claim `source` (module docstring)."""
    principal, _, instance = signer.partition("/")
    claimed = principal_of(source)
    if claimed != principal and KAFKA_USER.get(claimed) != principal:
        return False
    return not instance or source == signer or source.startswith(signer + "/")


def key_id(public: bytes) -> bytes:
    return hashlib.sha256(public).digest()[:8]


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _part(value: bytes | None) -> bytes:
    return _NONE if value is None else len(value).to_bytes(4, "big") + value


def leaf(topic: str, signer: bytes, kid: bytes, key: bytes | None, value: bytes | None) -> bytes:
    return hashlib.sha256(b"\x00" + _part(topic.encode()) + _part(signer) + _part(kid) + _part(key) + _part(value)).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle(leaves: Sequence[bytes]) -> tuple[bytes, list[bytes]]:
    """The root over `leaves` and each leaf's path (module docstring); an odd node is carried up."""
    paths = [b""] * len(leaves)
    level, members = list(leaves), [[i] for i in range(len(leaves))]
    while len(level) > 1:
        up, up_members = [], []
        for j in range(0, len(level) - 1, 2):
            left, right = level[j], level[j + 1]
            for i in members[j]:
                paths[i] += b"R" + right
            for i in members[j + 1]:
                paths[i] += b"L" + left
            up.append(_node(left, right))
            up_members.append(members[j] + members[j + 1])
        if len(level) % 2:
            up.append(level[-1])
            up_members.append(members[-1])
        level, members = up, up_members
    return level[0], paths


def root_of(digest: bytes, path: bytes) -> bytes:
    for at in range(0, len(path), 33):
        sibling = path[at + 1 : at + 33]
        digest = _node(digest, sibling) if path[at] == 0x52 else _node(sibling, digest)  # 0x52: "R"
    return digest


@dataclass(frozen=True)
class SigningKey:
    signer: str
    private: Ed25519PrivateKey
    kid: bytes

    @classmethod
    def of(cls, signer: str, private: Ed25519PrivateKey) -> SigningKey:
        return cls(signer, private, key_id(_raw(private.public_key())))


class Signer:
    """A process's private keys (one for a service; all of them for a test keyring): each
    record is signed with the key whose signer covers its source, the most specific first;
    a record no key covers gets the only key's (or the first) signature, and its consumers
    refuse the mismatch with the reason."""

    def __init__(self, keys: Mapping[str, Ed25519PrivateKey]) -> None:
        if not keys:
            raise ConfigurationError("a signer needs at least one key")
        self.keys = {name: SigningKey.of(name, private) for name, private in keys.items()}
        self._by_specificity = sorted(self.keys.values(), key=lambda k: (-len(k.signer), k.signer))
        self._choice: dict[str, SigningKey] = {}

    def key_for(self, source: str) -> SigningKey:
        chosen = self._choice.get(source)
        if chosen is None:
            chosen = next((k for k in self._by_specificity if covers(k.signer, source)), None) or next(iter(self.keys.values()))
            if len(self._choice) < 4096:
                self._choice[source] = chosen
        return chosen

    def sign(self, records: Sequence[tuple[str, bytes | None, bytes | None, str]]) -> list[Headers]:
        """Headers for each (topic, key, value, source), one signature per `LEAVES` records of a key."""
        headers: list[Headers] = [[] for _ in records]
        groups: dict[str, list[int]] = {}
        for index, (_, _, _, source) in enumerate(records):
            groups.setdefault(self.key_for(source).signer, []).append(index)
        for name, indexes in groups.items():
            signing = self.keys[name]
            signer = name.encode()
            for start in range(0, len(indexes), LEAVES):
                chunk = indexes[start : start + LEAVES]
                leaves = [leaf(records[i][0], signer, signing.kid, records[i][1], records[i][2]) for i in chunk]
                root, paths = merkle(leaves)
                signature = signing.kid + signing.private.sign(DOMAIN + root)
                for i, path in zip(chunk, paths, strict=True):
                    headers[i] = [(HEADER_SIGNER, signer), (HEADER_SIGNATURE, signature + path)]
        return headers


class Keyring:
    """Public keys by signer and key id: `prove` tells who signed a record, or why nobody did."""

    def __init__(self, public: Mapping[str, Iterable[bytes]]) -> None:
        self._keys = {(name.encode(), key_id(raw)): Ed25519PublicKey.from_public_bytes(raw) for name, raws in public.items() for raw in raws}
        self._verified: set[bytes] = set()  # signer + 0 + key id + a digest proven under a root it signed

    def prove(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> tuple[str | None, str | None]:
        """(the signer, None) if the record's signature holds, else (None, the reason)."""
        signer = signature = None
        for name, content in headers or ():
            if name == HEADER_SIGNER:
                signer = bytes(content)
            elif name == HEADER_SIGNATURE:
                signature = bytes(content)
        if signer is None or signature is None:
            return None, f"unsigned record (no {HEADER_SIGNER}/{HEADER_SIGNATURE} header): its writer is not proven"
        path = signature[72:]
        if len(signature) < 72 or len(path) % 33 or len(path) > _MAX_PATH:
            return None, f"malformed signature header ({len(signature)} bytes)"
        kid = signature[:8]
        public = self._keys.get((signer, kid))
        name = signer.decode(errors="replace")[:100]
        if public is None:
            return None, f"signed by {name!r} with key {kid.hex()}, which the keyring does not hold"
        # Walk up from the leaf; a digest already proven to lie under a root this key signed ends
        # the walk (the record's batch-mates share their upper nodes): ~2 hashes a record.
        prefix = signer + b"\x00" + kid
        verified = self._verified
        digest = leaf(topic, signer, kid, key, value)
        walked = [prefix + digest]
        for at in range(0, len(path), 33):
            if walked[-1] in verified:
                break
            sibling = path[at + 1 : at + 33]
            digest = _node(digest, sibling) if path[at] == 0x52 else _node(sibling, digest)  # 0x52: "R"
            walked.append(prefix + digest)
        else:
            if walked[-1] not in verified:  # the root, not proven yet: the one signature check of its batch
                try:
                    public.verify(signature[8:72], DOMAIN + digest)
                except InvalidSignature:
                    return None, f"bad signature: not what {name!r}'s key {kid.hex()} signed"
                if len(verified) + len(walked) > _CACHE_LIMIT:
                    verified.clear()
        verified.update(walked)
        return name, None


# -- keys on disk ------------------------------------------------------------------------------
def signers() -> list[str]:
    """Every signer a deployment gives a key: each service's principal, the CLI's."""
    return sorted({*SERVICES, *(KAFKA_USER.get(p, p) for w in WRITERS.values() for p in w)})


def generate(names: Iterable[str]) -> dict[str, Ed25519PrivateKey]:
    return {name: Ed25519PrivateKey.generate() for name in names}


def public_keyring(keys: Mapping[str, Ed25519PrivateKey]) -> dict[str, list[str]]:
    return {name: [_raw(private.public_key()).hex()] for name, private in sorted(keys.items())}


def _private_hex(private: Ed25519PrivateKey) -> str:
    from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

    return private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()).hex()


def write_private(path: Path, keys: Mapping[str, Ed25519PrivateKey]) -> Path:
    """A private key file (JSON, mode 0600 from its creation on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({name: _private_hex(private) for name, private in sorted(keys.items())}, out)
    os.chmod(path, 0o600)
    return path


def write_keys(directory: Path, names: Iterable[str] | None = None) -> dict[str, Path]:
    """The keys of a deployment in `directory`, made once and kept: ``<signer>.key`` for each
    signer and ``keyring.json``; a signer whose key exists keeps it. Paths by signer, and the
    keyring's under ``keyring``."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    keys: dict[str, Ed25519PrivateKey] = {}
    paths: dict[str, Path] = {}
    for name in names if names is not None else signers():
        path = paths[name] = directory / f"{name.replace('/', '_')}.key"
        if path.exists():
            keys.update(load_private(path))
        else:
            keys[name] = Ed25519PrivateKey.generate()
            write_private(path, {name: keys[name]})
    keyring = directory / "keyring.json"
    known = _load_json(keyring) if keyring.exists() else {}
    for name, publics in public_keyring(keys).items():
        known[name] = list(dict.fromkeys([*known.get(name, []), *publics]))
    keyring.write_text(json.dumps(known, indent=1, sort_keys=True))
    paths["keyring"] = keyring
    return paths


def _load_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"{path}: cannot read the key file: {error}") from error
    if not isinstance(loaded, dict):
        raise ConfigurationError(f"{path}: expected a JSON object of signer -> key")
    return loaded


def load_private(path: Path) -> dict[str, Ed25519PrivateKey]:
    try:
        return {name: Ed25519PrivateKey.from_private_bytes(bytes.fromhex(raw)) for name, raw in _load_json(path).items()}
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"{path}: not a hivemux private key file: {error}") from error


def load_keyring(path: Path) -> Keyring:
    try:
        return Keyring({name: [bytes.fromhex(raw) for raw in raws] for name, raws in _load_json(path).items()})
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"{path}: not a hivemux keyring: {error}") from error


# -- the process's keys (as `bus.connection` keeps the process's security options) --------------
@dataclass
class _Process:
    signer: Signer | None = None
    keyring: Keyring | None = None
    configured: bool = False


_process = _Process()


def configure(signing_key: str | None, keyring: str | None) -> None:
    """Use these key files for everything this process signs and verifies from now on; None
    for both leaves the process on keys of its own (module docstring)."""
    if bool(signing_key) != bool(keyring):
        raise ConfigurationError("HIVEMUX_SIGNING_KEY and HIVEMUX_KEYRING go together (a signer must verify what it reads)")
    if signing_key and keyring:
        use(Signer(load_private(Path(signing_key))), load_keyring(Path(keyring)))


def use(signer: Signer, keyring: Keyring) -> None:
    _process.signer, _process.keyring, _process.configured = signer, keyring, True


def configured() -> bool:
    return _process.configured


def require_keys(what: str) -> None:
    """A service process signs and verifies with its deployment's keys or does not start."""
    if not _process.configured:
        raise ConfigurationError(
            f"{what}: no keys: set HIVEMUX_SIGNING_KEY (this service's private key file) and HIVEMUX_KEYRING (the public "
            "keyring); `hivemux up` writes them into <workdir>/keys, `python -m hivemux.bus.signing DIR` makes a set"
        )


def process_signer() -> Signer:
    if _process.signer is None:
        _own_keys()
    return _process.signer  # type: ignore[return-value]


def process_keyring() -> Keyring:
    if _process.keyring is None:
        _own_keys()
    return _process.keyring  # type: ignore[return-value]


def _own_keys() -> None:
    # Nothing configured yet: the deployment's key files when the environment names them (a
    # process started without going through a service's settings still signs as its deployment).
    signing_key, keyring = os.environ.get("HIVEMUX_SIGNING_KEY"), os.environ.get("HIVEMUX_KEYRING")
    if signing_key and keyring:
        configure(signing_key, keyring)
        return
    log.warning("no HIVEMUX_SIGNING_KEY/HIVEMUX_KEYRING: signing and verifying with keys of this process only")
    keys = generate(signers())
    _process.signer = Signer(keys)
    _process.keyring = Keyring({name: [bytes.fromhex(raw) for raw in raws] for name, raws in public_keyring(keys).items()})


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m hivemux.bus.signing DIR  (writes DIR/<signer>.key for each signer and DIR/keyring.json)")
    for name, written in write_keys(Path(sys.argv[1])).items():
        print(f"{name}\t{written}")
