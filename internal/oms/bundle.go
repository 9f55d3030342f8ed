package oms

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	_ "crypto/sha512" // crypto.SHA384 and crypto.SHA512, for P-384 and P-521
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strconv"
)

const (
	// bundleMediaType is the Sigstore bundle v0.3 media type, which the reference writes and requires.
	bundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	// bundleMediaTypeParam is the same version in the older media type spelling.
	bundleMediaTypeParam = "application/vnd.dev.sigstore.bundle+json;version=0.3"
	// payloadType is the DSSE payload type of an in-toto statement.
	payloadType = "application/vnd.in-toto+json"
	// maxSignatures bounds the signatures of an envelope Verify tries against each trusted key.
	maxSignatures = 16
)

// bundleJSON is the part of a Sigstore bundle (protobuf-specs Bundle, JSON encoding) OMS uses, as
// read and as written.
type bundleJSON struct {
	MediaType            string            `json:"mediaType"`
	VerificationMaterial *verificationJSON `json:"verificationMaterial"`
	DSSEEnvelope         *envelopeJSON     `json:"dsseEnvelope,omitempty"`
}

type verificationJSON struct {
	PublicKey            *publicKeyJSON    `json:"publicKey,omitempty"`
	X509CertificateChain json.RawMessage   `json:"x509CertificateChain,omitempty"`
	Certificate          json.RawMessage   `json:"certificate,omitempty"`
	TlogEntries          []json.RawMessage `json:"tlogEntries"`
}

type publicKeyJSON struct {
	Hint string `json:"hint"`
}

// envelopeJSON is a DSSE v1.0 envelope; payload and sig are base64.
type envelopeJSON struct {
	Payload     string          `json:"payload"`
	PayloadType string          `json:"payloadType"`
	Signatures  []signatureJSON `json:"signatures"`
}

type signatureJSON struct {
	Sig   string `json:"sig"`
	KeyID string `json:"keyid"`
}

// present reports whether an optional JSON member was given a value.
func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// Verify checks a key-signed OMS signature, the bytes of model.sig, against the trusted keys and
// returns the manifest it vouches for. The bundle must be a Sigstore bundle v0.3 (JSON) whose
// verification material is a public key and whose content is a DSSE envelope with payload type
// application/vnd.in-toto+json; one of its signatures must verify, over the DSSE pre-authentication
// encoding of the payload, with one of keys (ECDSA P-256/SHA-256, P-384/SHA-384, P-521/SHA-512 with
// ASN.1 DER signatures, or Ed25519); the payload must pass ParseStatement. The bundle's key hint is
// not signed: it only tells ErrBadSignature (it names a trusted key) from ErrUntrustedKey. Transparency
// log entries, if any, are ignored: trust rests on the keys. See the errors for what each refusal means.
func Verify(bundle []byte, keys []crypto.PublicKey) (*Manifest, error) {
	var b bundleJSON
	if err := json.Unmarshal(bundle, &b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedBundle, err)
	}
	vm := b.VerificationMaterial
	switch {
	case vm == nil:
		return nil, fmt.Errorf("%w: no verificationMaterial", ErrMalformedBundle)
	case present(vm.Certificate):
		return nil, fmt.Errorf("%w (this one carries a signing certificate)", ErrKeylessUnsupported)
	case present(vm.X509CertificateChain):
		return nil, fmt.Errorf("%w (this one carries a certificate chain)", ErrKeylessUnsupported)
	case b.MediaType != bundleMediaType && b.MediaType != bundleMediaTypeParam:
		return nil, fmt.Errorf("%w: media type %q, want %q", ErrMalformedBundle, b.MediaType, bundleMediaType)
	case vm.PublicKey == nil:
		return nil, fmt.Errorf("%w: no publicKey in verificationMaterial", ErrMalformedBundle)
	case b.DSSEEnvelope == nil:
		return nil, fmt.Errorf("%w: no dsseEnvelope (a model's signature is a DSSE envelope)", ErrMalformedBundle)
	case b.DSSEEnvelope.PayloadType != payloadType:
		return nil, fmt.Errorf("%w: got %q", ErrPayloadType, b.DSSEEnvelope.PayloadType)
	}
	env := b.DSSEEnvelope
	payload, err := decodeBase64(env.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: dsseEnvelope.payload: %v", ErrMalformedBundle, err)
	}
	if len(env.Signatures) == 0 || len(env.Signatures) > maxSignatures {
		return nil, fmt.Errorf("%w: %d signatures, want 1 to %d", ErrMalformedBundle, len(env.Signatures), maxSignatures)
	}
	sigs := make([][]byte, len(env.Signatures))
	for i, s := range env.Signatures {
		if sigs[i], err = decodeBase64(s.Sig); err != nil {
			return nil, fmt.Errorf("%w: dsseEnvelope.signatures[%d].sig: %v", ErrMalformedBundle, i, err)
		}
	}
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
	}
	msg := pae(payload)
	for _, k := range keys {
		for _, sig := range sigs {
			if signatureValid(k, msg, sig) {
				return ParseStatement(payload)
			}
		}
	}
	hint := vm.PublicKey.Hint
	for _, k := range keys {
		if id, _ := KeyID(k); hint != "" && id == hint {
			return nil, fmt.Errorf("%w with trusted key %s: the payload or the signature was altered", ErrBadSignature, hint)
		}
	}
	if hint == "" {
		return nil, fmt.Errorf("%w: none of the %d trusted keys verifies it, and it names no key", ErrUntrustedKey,
			len(keys))
	}
	return nil, fmt.Errorf("%w: signed by key %q, not one of the %d trusted keys", ErrUntrustedKey, hint, len(keys))
}

// Sign signs m with key into a Sigstore bundle v0.3 (the bytes of model.sig) as the reference's key
// signer does: the statement ParseStatement reads, in a DSSE envelope, signed over its
// pre-authentication encoding (ECDSA: SHA-256/384/512 by curve, ASN.1 DER; Ed25519: the message
// itself), verification material a public key whose hint is KeyID(key.Public()), no transparency log
// entry. It needs no network. The signature is checked with key.Public() before Sign returns it.
func Sign(m *Manifest, key crypto.Signer) ([]byte, error) {
	pub := key.Public()
	hint, err := KeyID(pub)
	if err != nil {
		return nil, err
	}
	payload, err := m.statement()
	if err != nil {
		return nil, fmt.Errorf("oms: writing the statement: %w", err)
	}
	msg := pae(payload)
	digest, opts := signedDigest(pub, msg)
	sig, err := key.Sign(rand.Reader, digest, opts)
	if err != nil {
		return nil, fmt.Errorf("oms: signing: %w", err)
	}
	if !signatureValid(pub, msg, sig) {
		return nil, fmt.Errorf("oms: the signer's signature does not verify with its public key " +
			"(an ECDSA signer must return ASN.1 DER)")
	}
	return json.Marshal(bundleJSON{
		MediaType: bundleMediaType,
		VerificationMaterial: &verificationJSON{
			PublicKey: &publicKeyJSON{Hint: hint}, TlogEntries: []json.RawMessage{},
		},
		DSSEEnvelope: &envelopeJSON{
			Payload:     base64.StdEncoding.EncodeToString(payload),
			PayloadType: payloadType,
			Signatures:  []signatureJSON{{Sig: base64.StdEncoding.EncodeToString(sig)}},
		},
	})
}

// pae is DSSE v1's pre-authentication encoding of an in-toto payload, the bytes a signature covers:
// "DSSEv1" SP LEN(type) SP type SP LEN(payload) SP payload, lengths in ASCII decimal.
func pae(payload []byte) []byte {
	head := "DSSEv1 " + strconv.Itoa(len(payloadType)) + " " + payloadType + " " + strconv.Itoa(len(payload)) + " "
	return append([]byte(head), payload...)
}

// signedDigest is what a signer signs for msg with the key pub, which checkKey accepts, and how: the
// curve's hash of msg for ECDSA, msg itself for Ed25519.
func signedDigest(pub crypto.PublicKey, msg []byte) ([]byte, crypto.SignerOpts) {
	if k, ok := pub.(*ecdsa.PublicKey); ok {
		h, _ := ecdsaHash(k)
		d := h.New()
		d.Write(msg)
		return d.Sum(nil), h
	}
	return msg, crypto.Hash(0)
}

// signatureValid reports whether sig signs msg with pub, which checkKey accepts.
func signatureValid(pub crypto.PublicKey, msg, sig []byte) bool {
	digest, _ := signedDigest(pub, msg)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, digest, sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, digest, sig)
	}
	return false
}

// ecdsaHash is the hash Sigstore pairs with an ECDSA curve.
func ecdsaHash(k *ecdsa.PublicKey) (crypto.Hash, error) {
	switch k.Curve {
	case elliptic.P256():
		return crypto.SHA256, nil
	case elliptic.P384():
		return crypto.SHA384, nil
	case elliptic.P521():
		return crypto.SHA512, nil
	}
	return 0, fmt.Errorf("%w: ECDSA key on a curve other than P-256, P-384 or P-521", ErrUnsupportedKey)
}

// checkKey accepts the keys OMS signatures are verified with: ECDSA on P-256, P-384, P-521; Ed25519.
func checkKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		_, err := ecdsaHash(k)
		return err
	case ed25519.PublicKey:
		if len(k) == ed25519.PublicKeySize {
			return nil
		}
	}
	return fmt.Errorf("%w: %T", ErrUnsupportedKey, pub)
}

// KeyID names a public key as the reference implementation's bundle hint does: the lowercase hex
// SHA-256 of its PEM encoding (a PUBLIC KEY block of its PKIX DER, 64-column base64, trailing newline).
func KeyID(pub crypto.PublicKey) (string, error) {
	if err := checkKey(pub); err != nil {
		return "", err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrUnsupportedKey, err)
	}
	sum := sha256.Sum256(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	return hex.EncodeToString(sum[:]), nil
}

// ParsePublicKeyPEM reads a trusted key: one PEM "PUBLIC KEY" block (PKIX), ECDSA P-256, P-384,
// P-521 or Ed25519. Anything else is ErrUnsupportedKey.
func ParsePublicKeyPEM(data []byte) (crypto.PublicKey, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("%w: no PEM PUBLIC KEY block", ErrUnsupportedKey)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: more than one PEM block; give one key per file", ErrUnsupportedKey)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupportedKey, err)
	}
	if err := checkKey(pub); err != nil {
		return nil, err
	}
	return pub, nil
}

// ParsePrivateKeyPEM reads a signing key: a PEM "PRIVATE KEY" (PKCS #8) or "EC PRIVATE KEY" (SEC 1,
// optionally after an "EC PARAMETERS" block, as OpenSSL writes it), unencrypted, ECDSA P-256, P-384,
// P-521 or Ed25519. Anything else is ErrUnsupportedKey.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		block, rest := pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("%w: no PEM PRIVATE KEY or EC PRIVATE KEY block", ErrUnsupportedKey)
		}
		data = rest
		var key any
		var err error
		switch block.Type {
		case "EC PARAMETERS":
			continue
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		default:
			return nil, fmt.Errorf("%w: PEM block %q (encrypted keys are not supported)", ErrUnsupportedKey, block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnsupportedKey, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%w: %T cannot sign", ErrUnsupportedKey, key)
		}
		if err := checkKey(signer.Public()); err != nil {
			return nil, err
		}
		return signer, nil
	}
}

// decodeBase64 reads a protobuf JSON bytes value: standard or URL-safe base64, padded or not.
func decodeBase64(s string) ([]byte, error) {
	var err error
	for _, enc := range []*base64.Encoding{
		base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding,
	} {
		var b []byte
		if b, err = enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, err
}
