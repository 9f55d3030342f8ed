package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/store"
)

// MaxFileBytes caps the small files a checkpoint folder serves besides its tensors (config.json,
// tokenizer files): large enough for any tokenizer, small enough that no one mistakes the route for
// a way around the shard planner.
const MaxFileBytes = 64 << 20

// ErrNoFile is a file the checkpoint folder does not hold (or holds only as tensor data).
var ErrNoFile = errors.New("no such file in the checkpoint")

// ErrFileTooLarge is a file over MaxFileBytes.
var ErrFileTooLarge = errors.New("file over the size cap")

// File is one of a checkpoint's small files.
type File struct {
	Name string // relative to the checkpoint folder
	Key  string
	store.Info
}

// servedFiles are the small files of a checkpoint folder the files route serves (docs/contract.md
// lists them): what an engine loads beside the weights — the model and generation configs, the
// tokenizer in each of its formats, chat templates — and the signature. Anything else in the
// folder (dotfiles, editor backups, notes, other tools' state) is not the checkpoint's to publish.
var servedFiles = map[string]bool{
	"config.json":             true,
	"generation_config.json":  true,
	"tokenizer.json":          true,
	"tokenizer_config.json":   true,
	"tokenizer.model":         true, // SentencePiece
	"tiktoken.model":          true,
	"special_tokens_map.json": true,
	"added_tokens.json":       true,
	"vocab.json":              true,
	"vocab.txt":               true,
	"merges.txt":              true,
	"chat_template.jinja":     true,
	"chat_template.json":      true,
	oms.SignatureFile:         true, // docs/signing.md
}

// servable reports whether a folder file is one of servedFiles, or a tiktoken vocabulary
// (qwen.tiktoken), whose name is the model's own.
func servable(name string) bool {
	return servedFiles[name] ||
		strings.HasSuffix(name, ".tiktoken") && !strings.HasPrefix(name, ".") && !strings.Contains(name, "/")
}

// StatFile resolves a small file of a checkpoint: the same name rules as checkpoints, only the
// servable files the folder holds, at most MaxFileBytes.
func (c *Catalog) StatFile(ctx context.Context, checkpoint, name string) (File, error) {
	if err := store.ValidateKey(checkpoint); err != nil {
		return File{}, err
	}
	if err := store.ValidateKey(name); err != nil {
		return File{}, err
	}
	if !servable(name) {
		return File{}, fmt.Errorf(
			"%w: %s is not one of the files a checkpoint serves (configs, tokenizer files, chat templates, "+
				"the signature); tensor data is requested through /v1/shards", ErrNoFile, name)
	}
	key := checkpoint + "/" + name
	info, err := c.store.Stat(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return File{}, fmt.Errorf("%w: %s has no %s", ErrNoFile, checkpoint, name)
	}
	if err != nil {
		return File{}, err
	}
	if info.Size > MaxFileBytes {
		return File{}, fmt.Errorf("%w: %s is %d bytes, over %d", ErrFileTooLarge, name, info.Size, MaxFileBytes)
	}
	return File{Name: name, Key: key, Info: info}, nil
}

// ReadFile reads a small file whole, at the version StatFile saw.
func (c *Catalog) ReadFile(ctx context.Context, f File) ([]byte, error) {
	buf := make([]byte, f.Size)
	if err := c.ReadFileAt(ctx, f, buf, 0); err != nil {
		return nil, err
	}
	return buf, nil
}

// ReadFileAt reads len(p) bytes of a small file from off, at the version StatFile saw, so a file
// streamed a piece at a time is one version throughout. Bytes an earlier read of this file version
// found corrupt fail before they are read, and a read that finds bytes corrupt is remembered, as
// for tensor data (KnownCorrupt).
func (c *Catalog) ReadFileAt(ctx context.Context, f File, p []byte, off int64) error {
	if err := c.KnownCorrupt(f.Key, f.Version, off, int64(len(p))); err != nil {
		return err
	}
	err := c.store.ReadAt(ctx, f.Key, f.Version, p, off)
	var corrupt *store.CorruptError
	if errors.As(err, &corrupt) {
		c.corrupt.add(corrupt)
	}
	return err
}

// Files lists a checkpoint's servable files, sorted. The checkpoint must resolve.
func (c *Catalog) Files(ctx context.Context, checkpoint string) ([]File, error) {
	if _, _, _, err := c.root(ctx, checkpoint); err != nil {
		return nil, err
	}
	keys, err := c.store.List(ctx, checkpoint)
	if err != nil {
		return nil, err
	}
	out := []File{}
	for _, k := range keys {
		name := strings.TrimPrefix(k, checkpoint+"/")
		if !servable(name) {
			continue
		}
		f, err := c.StatFile(ctx, checkpoint, name)
		if errors.Is(err, ErrFileTooLarge) || errors.Is(err, ErrNoFile) || errors.Is(err, store.ErrInvalidKey) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}
