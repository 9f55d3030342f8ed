// Package oms reads, verifies and writes OpenSSF Model Signing (OMS) v1.0 signatures, the format of
// the reference implementation sigstore/model-transparency (model_signing 1.x): an in-toto Statement
// v1 whose predicate, https://model_signing/signature/v1.0, lists the SHA-256 of every file of a
// model or of every fixed-size shard of every file; carried as the payload of a DSSE v1.0 envelope
// inside a Sigstore bundle v0.3 (protobuf-specs, JSON encoding), by default in model.sig at the
// model's root. docs/signing.md describes the format as shardsrv relies on it. The package does no
// I/O of its own and no network access; it uses only the standard library's cryptography.
//
// # Contract
//
// Verify(bundle, keys) returns a *Manifest only if every one of these holds, and otherwise nil and an
// error matching exactly one of the sentinels in errors.go:
//
//   - the bundle is a Sigstore bundle v0.3 whose verification material is a public key (hint) and
//     whose content is a DSSE envelope (else ErrMalformedBundle; a certificate or a certificate chain
//     instead is ErrKeylessUnsupported);
//   - the envelope's payloadType is application/vnd.in-toto+json (ErrPayloadType);
//   - one of its signatures verifies, over DSSE's pre-authentication encoding of the payload
//     ("DSSEv1" SP len(type) SP type SP len(payload) SP payload), with one of keys: ECDSA P-256 with
//     SHA-256, P-384 with SHA-384, P-521 with SHA-512 (ASN.1 DER signatures, as the reference writes
//     them), or Ed25519 over the message itself (ErrBadSignature if the bundle's key hint names a
//     trusted key, else ErrUntrustedKey; a key of another type is ErrUnsupportedKey);
//   - the payload is an OMS v1.0 statement as ParseStatement checks it (*StatementError, matching
//     ErrInvalidStatement): SHA-256 only, resources in OMS order, shards contiguous, and the subject
//     digest equal to the SHA-256 of the concatenated raw resource digests.
//
// The subject digest binds the resource digests and their order, not their names: the names are
// bound by the signature. So a statement that passes ParseStatement alone vouches for nothing.
//
// A Manifest is immutable and safe for concurrent use. For a file it covers:
//
//   - Check(file, off, data) returns nil only if data is byte for byte what was signed for
//     [off, off+len(data)), which must be whole shards (Align gives them); each shard is hashed and
//     compared, and the first that differs is a *MismatchError naming the file and range;
//   - CheckFile checks a whole file from an io.ReaderAt, CheckSize only its size;
//   - Align widens any read to the fewest whole shards that contain it, within the signed size.
//
// A files-method manifest signs whole files, so it has no sizes and no ranges: Align refuses
// (ErrNotSharded), Check takes only a whole file, CheckFile streams one. A shards manifest covers no
// empty file (OMS signs no shard of one).
//
// BuildShards and BuildFiles hash a model's files into a manifest as the reference does (for the
// reference's sample model, its subject and resources exactly), and Sign writes it as a key-signed
// bundle in the layout of the reference's key signer, which Verify accepts.
//
// # Decisions
//
// Keyless signatures are refused. A Sigstore keyless bundle is signed by a short-lived Fulcio
// certificate whose only proof of time is a Rekor transparency log entry; verifying it offline needs
// Sigstore's trust root (Fulcio's CA certificates, Rekor's and the CT log's public keys, kept current),
// an expected identity and issuer, and a Sigstore verification library. This package verifies only
// bundles signed with a public key the operator trusts (ErrKeylessUnsupported says so), which needs
// nothing but the key; bundles signed with a certificate chain are refused the same way.
//
// Also refused: hashes other than SHA-256 (the reference can use BLAKE2 or BLAKE3), the pre-1.0
// predicate https://model_signing/Digests/v0.1 and the pre-1.0 mis-encoded PAE the reference still
// accepts from model_signing 0.2, single-file models (a resource named "."), RSA keys, encrypted
// private keys. Transparency log entries in a key-signed bundle are ignored: the key is the trust.
//
// Ignored files. As the reference does by default, a signature leaves out model.sig itself and, at
// the model's root only, .git/ and .github/ (whole trees), .gitattributes and .gitignore:
// DefaultIgnored. The build functions skip them and record them as the statement's ignore_paths; a
// verifier also leaves out what a statement's ignore_paths names (Manifest.Ignored).
//
// Order. OMS lists resources sorted by path compared component by component (Python's PurePosixPath
// order; each component by code point, which is UTF-8 byte order), then by start offset: "a/b" sorts
// before "a-b" and "a.b", unlike in a plain byte-order sort of the whole path. ParseStatement requires
// that order; the build functions produce it.
//
// Key id. The bundle's verificationMaterial.publicKey.hint is KeyID: the hex SHA-256 of the key's PEM
// (PKIX) encoding, as the reference computes it. It is not signed, so Verify tries every trusted key
// regardless and uses the hint only to word its refusal.
package oms
