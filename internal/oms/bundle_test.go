package oms

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// verifyErrors are the sentinels of which every error of Verify matches exactly one.
var verifyErrors = []error{ErrMalformedBundle, ErrKeylessUnsupported, ErrPayloadType, ErrUntrustedKey,
	ErrBadSignature, ErrUnsupportedKey, ErrInvalidStatement}

// checkVerifyError fails unless err matches want and no other sentinel of Verify.
func checkVerifyError(t testing.TB, err, want error) {
	t.Helper()
	for _, e := range verifyErrors {
		if got := errors.Is(err, e); got != (e == want) {
			t.Fatalf("error %v: errors.Is(%v) = %v", err, e, got)
		}
	}
}

func pemEncode(t *testing.T, typ string, der []byte, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// Sign writes what Verify accepts, for every kind of key, with the keys read back from PEM files.
func TestSignVerifyRoundTrip(t *testing.T) {
	m := sampleManifest(t)
	want, err := m.statement()
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range testKeys(t) {
		t.Run(name, func(t *testing.T) {
			der, err := x509.MarshalPKCS8PrivateKey(key)
			privPEM := pemEncode(t, "PRIVATE KEY", der, err)
			der, err = x509.MarshalPKIXPublicKey(key.Public())
			pub, err := ParsePublicKeyPEM(pemEncode(t, "PUBLIC KEY", der, err))
			if err != nil {
				t.Fatal(err)
			}
			signer, err := ParsePrivateKeyPEM(privPEM)
			if err != nil {
				t.Fatal(err)
			}
			bundle, err := Sign(m, signer)
			if err != nil {
				t.Fatal(err)
			}
			other := testKeys(t)["P-256"].Public()
			got, err := Verify(bundle, []crypto.PublicKey{other, pub})
			if err != nil {
				t.Fatal(err)
			}
			st, err := got.statement()
			if err != nil {
				t.Fatal(err)
			}
			if string(st) != string(want) {
				t.Errorf("verified statement differs:\n%s\nwant\n%s", st, want)
			}
			checkBundleLayout(t, bundle, pub)
		})
	}
}

// checkBundleLayout checks the members the reference writes and reads.
func checkBundleLayout(t *testing.T, bundle []byte, pub crypto.PublicKey) {
	t.Helper()
	var b struct {
		MediaType            string
		VerificationMaterial struct {
			PublicKey   struct{ Hint string }
			TlogEntries []any
		}
		DSSEEnvelope struct {
			PayloadType string
			Signatures  []struct{ Sig []byte }
		}
	}
	if err := json.Unmarshal(bundle, &b); err != nil {
		t.Fatal(err)
	}
	id, err := KeyID(pub)
	if err != nil {
		t.Fatal(err)
	}
	vm := b.VerificationMaterial
	if b.MediaType != bundleMediaType || vm.PublicKey.Hint != id || vm.TlogEntries == nil ||
		b.DSSEEnvelope.PayloadType != payloadType || len(b.DSSEEnvelope.Signatures) != 1 {
		t.Errorf("bundle layout: %s", bundle)
	}
	if _, ok := pub.(*ecdsa.PublicKey); ok {
		var rs struct{ R, S *big.Int }
		if rest, err := asn1.Unmarshal(b.DSSEEnvelope.Signatures[0].Sig, &rs); err != nil || len(rest) != 0 {
			t.Errorf("ECDSA signature is not ASN.1 DER: %v", err)
		}
	}
}

// A bundle the reference implementation signed with its test key verifies with that key.
func TestVerifyReferenceBundle(t *testing.T) {
	pub, err := ParsePublicKeyPEM(readFile(t, "reference_key_p384.pub.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := KeyID(pub); id != "e8450dec4eb99dae995da9af1bc2cc9f76ed669ee2e744f57abba763df3e3f8e" {
		t.Errorf("KeyID = %s, not the reference's hint", id)
	}
	m, err := Verify(readFile(t, "reference_key_p384.sig"), []crypto.PublicKey{pub})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"signme-1", "signme-2"}, m.Files()); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	if !m.Ignored("ignore-me") || !m.Ignored(".git/config") || m.Ignored("signme-1") {
		t.Errorf("ignore_paths %q not applied", m.IgnorePaths())
	}
}

// resign replaces the statement of a bundle and signs it with key, as a signer would.
func resign(t *testing.T, bundle []byte, payload []byte, key crypto.Signer) []byte {
	t.Helper()
	return editBundle(t, bundle, func(b *bundleJSON) {
		msg := pae(payload)
		digest, opts := signedDigest(key.Public(), msg)
		sig, err := key.Sign(rand.Reader, digest, opts)
		if err != nil {
			t.Fatal(err)
		}
		b.DSSEEnvelope.Payload = base64.StdEncoding.EncodeToString(payload)
		b.DSSEEnvelope.Signatures[0].Sig = base64.StdEncoding.EncodeToString(sig)
	})
}

func editBundle(t *testing.T, bundle []byte, edit func(*bundleJSON)) []byte {
	t.Helper()
	var b bundleJSON
	if err := json.Unmarshal(bundle, &b); err != nil {
		t.Fatal(err)
	}
	edit(&b)
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestVerifyRefuses(t *testing.T) {
	keys := testKeys(t)
	signer, stranger := keys["P-256"], keys["Ed25519"]
	trusted := []crypto.PublicKey{signer.Public()}
	m := sampleManifest(t)
	bundle, err := Sign(m, signer)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := m.statement()
	if err != nil {
		t.Fatal(err)
	}
	byStranger, err := Sign(m, stranger)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey := testRSASigner(t).(*rsa.PrivateKey)
	for _, c := range []struct {
		name   string
		bundle []byte
		keys   []crypto.PublicKey
		want   error
	}{
		{"untrusted key", byStranger, trusted, ErrUntrustedKey},
		{"untrusted key, no hint", editBundle(t, byStranger, func(b *bundleJSON) {
			b.VerificationMaterial.PublicKey.Hint = ""
		}), trusted, ErrUntrustedKey},
		{"no trusted key", bundle, nil, ErrUntrustedKey},
		{"tampered payload", editBundle(t, bundle, func(b *bundleJSON) {
			p := strings.Replace(string(payload), `"d0/f00:0:8"`, `"d0/f00:0:9"`, 1)
			b.DSSEEnvelope.Payload = base64.StdEncoding.EncodeToString([]byte(p))
		}), trusted, ErrBadSignature},
		{"tampered signature", editBundle(t, bundle, func(b *bundleJSON) {
			sig, _ := base64.StdEncoding.DecodeString(b.DSSEEnvelope.Signatures[0].Sig)
			sig[len(sig)-1] ^= 1
			b.DSSEEnvelope.Signatures[0].Sig = base64.StdEncoding.EncodeToString(sig)
		}), trusted, ErrBadSignature},
		{"keyless (reference)", readFile(t, "reference_keyless.sig"), trusted, ErrKeylessUnsupported},
		{"certificate chain (reference)", readFile(t, "reference_cert_chain.sig"), trusted, ErrKeylessUnsupported},
		{"wrong payloadType", editBundle(t, bundle, func(b *bundleJSON) {
			b.DSSEEnvelope.PayloadType = "application/json"
		}), trusted, ErrPayloadType},
		{"wrong media type", editBundle(t, bundle, func(b *bundleJSON) {
			b.MediaType = "application/vnd.dev.sigstore.bundle+json;version=0.1"
		}), trusted, ErrMalformedBundle},
		{"no envelope", editBundle(t, bundle, func(b *bundleJSON) { b.DSSEEnvelope = nil }), trusted,
			ErrMalformedBundle},
		{"no verification material", editBundle(t, bundle, func(b *bundleJSON) { b.VerificationMaterial = nil }),
			trusted, ErrMalformedBundle},
		{"no signature", editBundle(t, bundle, func(b *bundleJSON) { b.DSSEEnvelope.Signatures = nil }), trusted,
			ErrMalformedBundle},
		{"payload not base64", editBundle(t, bundle, func(b *bundleJSON) { b.DSSEEnvelope.Payload = "@@" }),
			trusted, ErrMalformedBundle},
		{"not JSON", []byte("model.sig"), trusted, ErrMalformedBundle},
		{"RSA key", bundle, []crypto.PublicKey{&rsaKey.PublicKey}, ErrUnsupportedKey},
		{"signed invalid statement", resign(t, bundle, []byte(strings.Replace(string(payload),
			"https://model_signing/signature/v1.0", predicateTypeV01, 1)), signer), trusted, ErrInvalidStatement},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := Verify(c.bundle, c.keys)
			if m != nil {
				t.Error("returned a manifest")
			}
			checkVerifyError(t, err, c.want)
		})
	}
}

// Verify takes the other spelling of the v0.3 media type, unpadded and URL-safe base64, and a valid
// signature after an invalid one.
func TestVerifyAcceptsEquivalentForms(t *testing.T) {
	key := testKeys(t)["P-384"]
	bundle, err := Sign(sampleManifest(t), key)
	if err != nil {
		t.Fatal(err)
	}
	edited := editBundle(t, bundle, func(b *bundleJSON) {
		b.MediaType = bundleMediaTypeParam
		env := b.DSSEEnvelope
		env.Payload = strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(env.Payload), "=")
		env.Signatures = append([]signatureJSON{{Sig: "AAAA"}}, env.Signatures...)
	})
	if _, err := Verify(edited, []crypto.PublicKey{key.Public()}); err != nil {
		t.Fatal(err)
	}
}

// rawSigner signs like an ECDSA key but returns r||s, not ASN.1 DER.
type rawSigner struct{ *ecdsa.PrivateKey }

func (s rawSigner) Sign(rnd io.Reader, digest []byte, _ crypto.SignerOpts) ([]byte, error) {
	r, ss, err := ecdsa.Sign(rnd, s.PrivateKey, digest)
	if err != nil {
		return nil, err
	}
	return append(r.FillBytes(make([]byte, 32)), ss.FillBytes(make([]byte, 32))...), nil
}

func TestSignRefusesAnUnverifiableSignature(t *testing.T) {
	key := rawSigner{testKeys(t)["P-256"].(*ecdsa.PrivateKey)}
	if _, err := Sign(sampleManifest(t), key); err == nil || !strings.Contains(err.Error(), "DER") {
		t.Fatalf("a raw r||s signature was written: %v", err)
	}
	if _, err := Sign(sampleManifest(t), testRSASigner(t)); !errors.Is(err, ErrUnsupportedKey) {
		t.Fatalf("RSA: %v", err)
	}
}

func testRSASigner(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestParseKeysPEM(t *testing.T) {
	keys := testKeys(t)
	ec := keys["P-256"].(*ecdsa.PrivateKey)
	sec1, err := x509.MarshalECPrivateKey(ec)
	withParams := append(pemEncode(t, "EC PARAMETERS", []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}, nil),
		pemEncode(t, "EC PRIVATE KEY", sec1, err)...)
	if k, err := ParsePrivateKeyPEM(withParams); err != nil || !ec.Equal(k) {
		t.Errorf("SEC 1 key after EC PARAMETERS: %v", err)
	}
	rsaKey := testRSASigner(t).(*rsa.PrivateKey)
	x25519, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(rsaKey)
	rsaPriv := pemEncode(t, "PRIVATE KEY", der, err)
	der, err = x509.MarshalPKCS8PrivateKey(x25519)
	xPriv := pemEncode(t, "PRIVATE KEY", der, err)
	for name, data := range map[string][]byte{
		"RSA":       rsaPriv,
		"X25519":    xPriv,
		"encrypted": pemEncode(t, "ENCRYPTED PRIVATE KEY", []byte{1}, nil),
		"public":    pemEncode(t, "PUBLIC KEY", []byte{1}, nil),
		"empty":     nil,
	} {
		if _, err := ParsePrivateKeyPEM(data); !errors.Is(err, ErrUnsupportedKey) {
			t.Errorf("private %s: %v", name, err)
		}
	}
	der, err = x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	rsaPub := pemEncode(t, "PUBLIC KEY", der, err)
	der, err = x509.MarshalPKIXPublicKey(ec.Public())
	ecPub := pemEncode(t, "PUBLIC KEY", der, err)
	for name, data := range map[string][]byte{
		"RSA":      rsaPub,
		"two keys": append(append([]byte{}, ecPub...), ecPub...),
		"private":  withParams,
		"garbage":  []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
	} {
		if _, err := ParsePublicKeyPEM(data); !errors.Is(err, ErrUnsupportedKey) {
			t.Errorf("public %s: %v", name, err)
		}
	}
}

// Verify never panics, and accepts nothing but a manifest.
func FuzzVerify(f *testing.F) {
	key := testKeys(f)["Ed25519"]
	refKey, err := ParsePublicKeyPEM(readFile(f, "reference_key_p384.pub.pem"))
	if err != nil {
		f.Fatal(err)
	}
	bundle, err := Sign(sampleManifest(f), key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(bundle)
	for _, name := range []string{"reference_key_p384.sig", "reference_keyless.sig", "reference_cert_chain.sig"} {
		f.Add(readFile(f, name))
	}
	f.Add([]byte(`{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{"publicKey":{}},` +
		`"dsseEnvelope":{"payloadType":"application/vnd.in-toto+json","signatures":[{"sig":""}]}}`))
	keys := []crypto.PublicKey{key.Public(), refKey}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Verify(data, keys)
		if err == nil && (m == nil || len(m.Files()) == 0) {
			t.Fatal("accepted without a manifest")
		}
		if err != nil && m != nil {
			t.Fatal("refused with a manifest")
		}
	})
}
