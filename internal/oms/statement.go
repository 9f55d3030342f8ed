package oms

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
)

const (
	statementType = "https://in-toto.io/Statement/v1"
	predicateType = "https://model_signing/signature/v1.0"
	// predicateTypeV01 is the experimental predicate of model_signing v0.2, which signs no serialization.
	predicateTypeV01 = "https://model_signing/Digests/v0.1"
	hashSHA256       = "sha256"
)

// statementJSON is an in-toto Statement v1 with the OMS v1.0 predicate, as read and as written.
type statementJSON struct {
	Type          string        `json:"_type"`
	Subject       []subjectJSON `json:"subject"`
	PredicateType string        `json:"predicateType"`
	Predicate     predicateJSON `json:"predicate"`
}

type subjectJSON struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// predicateJSON holds the members of the v1.0 predicate; a verifier ignores any other.
type predicateJSON struct {
	Serialization serializationJSON `json:"serialization"`
	Resources     []resourceJSON    `json:"resources"`
}

type serializationJSON struct {
	Method        string          `json:"method"`
	HashType      string          `json:"hash_type"`
	AllowSymlinks bool            `json:"allow_symlinks"`
	ShardSize     json.RawMessage `json:"shard_size,omitempty"` // a number: the reference writes 8.0
	IgnorePaths   []string        `json:"ignore_paths,omitempty"`
}

type resourceJSON struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Digest    string `json:"digest"`
}

// ParseStatement reads an OMS v1.0 in-toto statement (a DSSE payload) into its Manifest, checking
// that it is one: _type https://in-toto.io/Statement/v1, predicateType
// https://model_signing/signature/v1.0, one subject; serialization method files, or shards with a
// whole shard_size; SHA-256 everywhere (hash_type sha256, or sha256-sharded-N for shards; resource
// algorithm sha256 or sha256-sharded-N); resources in OMS order, each file once, named PATH (files) or
// PATH:START:END (shards, contiguous from 0, every shard shard_size bytes but a file's last); and the
// subject's sha256 equal to the SHA-256 of the raw resource digests concatenated in that order. Any
// violation is a *StatementError naming the member. It checks no signature: see Verify.
func ParseStatement(payload []byte) (*Manifest, error) {
	var st statementJSON
	if err := json.Unmarshal(payload, &st); err != nil {
		return nil, statementErr("(payload)", "not an in-toto statement in JSON: %v", err)
	}
	if st.Type != statementType {
		return nil, statementErr("_type", "is %q, want %q", st.Type, statementType)
	}
	if st.PredicateType != predicateType {
		if st.PredicateType == predicateTypeV01 {
			return nil, statementErr("predicateType", "is %q, the pre-1.0 format; re-sign with OMS v1.0",
				st.PredicateType)
		}
		return nil, statementErr("predicateType", "is %q, want %q", st.PredicateType, predicateType)
	}
	if len(st.Subject) != 1 {
		return nil, statementErr("subject", "has %d entries, want 1", len(st.Subject))
	}
	declared, ok := parseDigest(st.Subject[0].Digest[hashSHA256])
	if !ok {
		return nil, statementErr("subject[0].digest.sha256", "is %q, not 64 lowercase hex digits",
			st.Subject[0].Digest[hashSHA256])
	}
	ser := st.Predicate.Serialization
	method, shardSize, err := ser.parse()
	if err != nil {
		return nil, err
	}
	ignore := slices.Clone(ser.IgnorePaths)
	for i, p := range ignore {
		if !validPath(p) {
			return nil, statementErr("predicate.serialization.ignore_paths["+strconv.Itoa(i)+"]",
				"%q is not a relative '/'-separated path without empty, . or .. parts", p)
		}
	}
	slices.Sort(ignore)
	files, err := parseResources(st.Predicate.Resources, method, shardSize)
	if err != nil {
		return nil, err
	}
	m := newManifest(st.Subject[0].Name, method, shardSize, ser.AllowSymlinks, slices.Compact(ignore), files)
	if m.subject != declared {
		return nil, statementErr("subject[0].digest.sha256", "is %x, but the resources hash to %x",
			declared, m.subject)
	}
	return m, nil
}

// parse checks the serialization and returns its method and shard size (0 for files).
func (s serializationJSON) parse() (Method, int64, error) {
	switch Method(s.Method) {
	case MethodFiles:
		if s.HashType != hashSHA256 {
			return "", 0, statementErr("predicate.serialization.hash_type", "is %q; only sha256 is supported",
				s.HashType)
		}
		return MethodFiles, 0, nil
	case MethodShards:
		f, err := strconv.ParseFloat(string(s.ShardSize), 64)
		if err != nil || f != math.Trunc(f) || f < 1 || f > float64(maxSize) {
			return "", 0, statementErr("predicate.serialization.shard_size", "is %s, not a whole number of "+
				"bytes in [1, 2^53]", s.ShardSize)
		}
		size := int64(f)
		if s.HashType != hashSHA256 && s.HashType != resourceAlgorithm(MethodShards, size) {
			return "", 0, statementErr("predicate.serialization.hash_type", "is %q; only sha256 (or %s) is supported",
				s.HashType, resourceAlgorithm(MethodShards, size))
		}
		return MethodShards, size, nil
	}
	return "", 0, statementErr("predicate.serialization.method", "is %q, want %q or %q",
		s.Method, MethodFiles, MethodShards)
}

// resourceAlgorithm is the algorithm OMS names in every resource of a manifest.
func resourceAlgorithm(method Method, shardSize int64) string {
	if method == MethodShards {
		return hashSHA256 + "-sharded-" + strconv.FormatInt(shardSize, 10)
	}
	return hashSHA256
}

// resourceName is the name OMS gives a shard of path: PATH in a files manifest, PATH:START:END else.
func resourceName(method Method, path string, s Shard) string {
	if method == MethodShards {
		return path + ":" + strconv.FormatInt(s.Start, 10) + ":" + strconv.FormatInt(s.End, 10)
	}
	return path
}

// parseResources checks resources (see ParseStatement) and groups them by file.
func parseResources(resources []resourceJSON, method Method, shardSize int64) ([]signedFile, error) {
	if len(resources) == 0 {
		return nil, statementErr("predicate.resources", "is empty")
	}
	algorithm := resourceAlgorithm(method, shardSize)
	var files []signedFile
	for i, r := range resources {
		field := "predicate.resources[" + strconv.Itoa(i) + "]"
		if r.Algorithm != algorithm {
			return nil, statementErr(field+".algorithm", "is %q, want %q", r.Algorithm, algorithm)
		}
		digest, ok := parseDigest(r.Digest)
		if !ok {
			return nil, statementErr(field+".digest", "is %q, not 64 lowercase hex digits", r.Digest)
		}
		s, path, problem := parseName(method, r.Name)
		if problem != "" {
			return nil, statementErr(field+".name", "%q %s", r.Name, problem)
		}
		s.Digest = digest
		var prev *signedFile
		if len(files) > 0 {
			prev = &files[len(files)-1]
		}
		switch {
		case prev != nil && prev.path == path && method == MethodShards:
			last := prev.shards[len(prev.shards)-1]
			if last.End-last.Start != shardSize {
				return nil, statementErr(field+".name", "%q follows a short shard [%d, %d): only the last shard "+
					"of a file may be shorter than %d bytes", r.Name, last.Start, last.End, shardSize)
			}
			if s.Start != last.End {
				return nil, statementErr(field+".name", "%q starts at %d; the previous shard of %s ends at %d",
					r.Name, s.Start, path, last.End)
			}
		case prev != nil && comparePaths(prev.path, path) >= 0:
			return nil, statementErr(field+".name", "%q is repeated or out of OMS order (after %q)", r.Name, prev.path)
		case s.Start != 0:
			return nil, statementErr(field+".name", "%q is the first shard of %s but starts at %d, not 0",
				r.Name, path, s.Start)
		}
		if method == MethodShards && (s.End <= s.Start || s.End-s.Start > shardSize) {
			return nil, statementErr(field+".name", "%q is empty or longer than the shard size %d", r.Name, shardSize)
		}
		if prev == nil || prev.path != path {
			files = append(files, signedFile{path: path})
		}
		f := &files[len(files)-1]
		f.shards = append(f.shards, s)
	}
	return files, nil
}

// parseName splits a resource name into its shard (without digest) and path, or says what is wrong.
func parseName(method Method, name string) (s Shard, path, problem string) {
	const badPath = "is not a relative '/'-separated path without empty, . or .. parts (the model root itself " +
		"names a single-file model, which is not supported)"
	if method == MethodFiles {
		if !validPath(name) {
			return Shard{}, "", badPath
		}
		return Shard{Start: 0, End: UnknownEnd}, name, ""
	}
	parts := strings.Split(name, ":")
	if len(parts) != 3 {
		return Shard{}, "", "is not PATH:START:END"
	}
	if !validPath(parts[0]) {
		return Shard{}, "", badPath
	}
	start, okStart := parseOffset(parts[1])
	end, okEnd := parseOffset(parts[2])
	if !okStart || !okEnd {
		return Shard{}, "", "has an offset that is not a decimal integer in [0, 2^53] written canonically"
	}
	return Shard{Start: start, End: end}, parts[0], ""
}

func parseOffset(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil && v >= 0 && v <= maxSize && strconv.FormatInt(v, 10) == s
}

// parseDigest reads a SHA-256 digest written as 64 lowercase hex digits, the one form OMS writes.
func parseDigest(s string) (d [32]byte, ok bool) {
	if len(s) != hex.EncodedLen(len(d)) || strings.ToLower(s) != s {
		return d, false
	}
	_, err := hex.Decode(d[:], []byte(s))
	return d, err == nil
}

// statement is m as the OMS v1.0 in-toto statement the reference writes: the same subject,
// serialization and resources (shard_size as an integer, hash_type sha256), in compact JSON.
func (m *Manifest) statement() ([]byte, error) {
	ser := serializationJSON{
		Method: string(m.method), HashType: hashSHA256, AllowSymlinks: m.allowSymlinks, IgnorePaths: m.ignorePaths,
	}
	if m.method == MethodShards {
		ser.ShardSize = json.RawMessage(strconv.FormatInt(m.shardSize, 10))
	}
	algorithm := resourceAlgorithm(m.method, m.shardSize)
	var resources []resourceJSON
	for _, f := range m.files {
		for _, s := range f.shards {
			resources = append(resources, resourceJSON{
				Name: resourceName(m.method, f.path, s), Algorithm: algorithm, Digest: hex.EncodeToString(s.Digest[:]),
			})
		}
	}
	st := statementJSON{
		Type:          statementType,
		Subject:       []subjectJSON{{Name: m.name, Digest: map[string]string{hashSHA256: hex.EncodeToString(m.subject[:])}}},
		PredicateType: predicateType,
		Predicate:     predicateJSON{Serialization: ser, Resources: resources},
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(st); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
