package oms

import (
	"errors"
	"fmt"
)

// Errors of Verify and Sign. Every error Verify returns matches exactly one of ErrMalformedBundle,
// ErrKeylessUnsupported, ErrPayloadType, ErrUntrustedKey, ErrBadSignature, ErrUnsupportedKey or
// ErrInvalidStatement under errors.Is.
var (
	// ErrMalformedBundle: not a Sigstore bundle v0.3 in JSON carrying a DSSE envelope and a public key
	// hint, or a field of it does not decode.
	ErrMalformedBundle = errors.New("oms: malformed Sigstore bundle")
	// ErrKeylessUnsupported: the bundle is signed with a certificate (Sigstore keyless signing, with a
	// Fulcio certificate and a Rekor entry, or a certificate chain). Verifying it needs Sigstore's trust
	// root, which this package does not carry; it verifies key-signed bundles only.
	ErrKeylessUnsupported = errors.New("oms: certificate-signed (keyless) bundle: verifying it needs " +
		"Sigstore's trust root (Fulcio CA, Rekor log); only bundles signed with a trusted public key are supported")
	// ErrPayloadType: the DSSE payload is not an in-toto statement.
	ErrPayloadType = errors.New("oms: DSSE payload type is not " + payloadType)
	// ErrUntrustedKey: no trusted key verifies a signature, and the bundle does not name one of them:
	// the model was signed by someone else (or no key is trusted).
	ErrUntrustedKey = errors.New("oms: not signed by a trusted key")
	// ErrBadSignature: the bundle names a trusted key, but its signature does not verify with it: the
	// payload or the signature was altered.
	ErrBadSignature = errors.New("oms: signature does not verify")
	// ErrUnsupportedKey: a key is not ECDSA P-256, P-384, P-521 or Ed25519, or a PEM block does not hold one.
	ErrUnsupportedKey = errors.New("oms: unsupported key")
	// ErrInvalidStatement is matched by every *StatementError.
	ErrInvalidStatement = errors.New("oms: invalid OMS statement")
)

// StatementError says what in an OMS statement is wrong: the member, as a JSON path such as
// predicate.resources[3].name, and the problem.
type StatementError struct {
	Field   string
	Problem string
}

func (e *StatementError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidStatement, e.Field, e.Problem)
}

func (e *StatementError) Is(target error) bool { return target == ErrInvalidStatement }

func statementErr(field, format string, args ...any) error {
	return &StatementError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// Errors of the manifest's checks.
var (
	// ErrMismatch is matched by *MismatchError and *SizeError: the bytes are not the signed ones.
	ErrMismatch = errors.New("oms: content does not match the signed manifest")
	// ErrNotCovered: the manifest has no digest for the file.
	ErrNotCovered = errors.New("oms: file not covered by the signed manifest")
	// ErrNotSharded: a files-method manifest signs whole files only, so a range of one cannot be
	// verified alone; verify the whole file with CheckFile.
	ErrNotSharded = errors.New("oms: manifest signs whole files (method files), not ranges")
	// ErrRange: a range is negative, runs past the signed file's end, or (for Check) does not start
	// and end on shard boundaries.
	ErrRange = errors.New("oms: range does not fit the signed shards")
)

// MismatchError names the signed range [Start, End) of File whose SHA-256 differs from the manifest's.
type MismatchError struct {
	File       string
	Start, End int64
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("oms: sha256 of %s [%d, %d) does not match the signed manifest", e.File, e.Start, e.End)
}

func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// SizeError: File is Size bytes long but was signed at Signed bytes (a sharded manifest records sizes).
type SizeError struct {
	File         string
	Size, Signed int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("oms: %s is %d bytes, signed at %d bytes", e.File, e.Size, e.Signed)
}

func (e *SizeError) Is(target error) bool { return target == ErrMismatch }
