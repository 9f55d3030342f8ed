// Command shardsrv serves remapped tensor shards from safetensors checkpoints.
//
//	shardsrv serve   --addr HOST:PORT --store DIR|file://DIR|s3://BUCKET/PREFIX|gs://…|az://… [flags]
//	shardsrv example --out DIR
//
// Every flag of serve can also be set by an environment variable: SHARDSRV_ and the flag name in
// upper case with '-' as '_' (SHARDSRV_STORE, SHARDSRV_ADDR, ...). A flag on the command line wins.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/example"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `shardsrv serves remapped tensor shards from safetensors checkpoints.

Usage:
  shardsrv serve   [flags]                      run the HTTP service (see 'shardsrv serve -h')
  shardsrv version                              print the version
  shardsrv example --out DIR                    write the example checkpoint and requests into DIR, print curls
  shardsrv layout  --checkpoint NAME [--engine vllm|sglang|megatron] --tp N --rank R [--ep] [--format json|table]
                                                print the tensors an engine holds on a rank (a request body, or a table)
  shardsrv plan    --request FILE               show what a request reads: a table per tensor
  shardsrv fetch   --request FILE -o OUT|-      fetch a shard into a file or stdout (progress on a terminal)
  shardsrv fetch   --checkpoint NAME --layout vllm|sglang --tp N --rank R|all --out DIR
                                                write a directory vLLM or SGLang loads with --load-format sharded_state
  shardsrv prefetch --checkpoint NAME [--layout vllm --tp N --rank R|all]
                                                warm the (shared) cache with a checkpoint or ranks
  shardsrv sign    --key KEY.pem DIR|STORE-URL
                                                sign a checkpoint folder (OpenSSF Model Signing, model.sig)
  shardsrv verify  --trust-key PUB.pem DIR|STORE-URL
                                                check a signed checkpoint folder, every byte

The client commands take --server URL (SHARDSRV_SERVER, default http://localhost:8080), --token
(SHARDSRV_TOKEN) and, for an https:// server whose CA the system does not trust, --ca-file
(SHARDSRV_CA_FILE); a STORE-URL is one --store of serve takes (s3://, gs://, az://, file://).
'shardsrv COMMAND -h' explains each command's flags, with examples.

A client POSTs the boxes of destination tensors it holds and the remap table (blocks) to
/v1/shards, or an engine's rank ("layout") that the server expands; the service reads only the
byte ranges it needs and streams back the bytes. See README.md and openapi.yaml.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:], os.Stderr)
	case "example":
		err = writeExample(os.Args[2:], os.Stdout, os.Stderr)
	case "fetch":
		err = fetch(os.Args[2:], os.Stdout, os.Stderr)
	case "plan":
		err = planCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "sign":
		err = signCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "verify":
		err = verifyCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "layout":
		err = layoutCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "prefetch":
		err = prefetchCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	case "version", "--version":
		fmt.Println("shardsrv", version)
		return
	default:
		fmt.Fprintf(os.Stderr, "shardsrv: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return // asked for: COMMAND -h printed its usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is how a command's error is printed: prefixed once, though the client's errors
// (problems from the server) carry the prefix already, also when wrapped ("FILE: shardsrv: ...").
func errorLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), ": shardsrv: ", ": ")
	var p *api.ProblemError
	if errors.As(err, &p) && p.Status == http.StatusUnauthorized {
		msg += "\n  the server wants a bearer token: give --token TOKEN (or SHARDSRV_TOKEN)"
	}
	return "shardsrv: " + strings.TrimPrefix(msg, "shardsrv: ")
}

const exampleUsage = `Usage: shardsrv example [--out DIR] [--addr HOST:PORT]

Writes a store holding the example checkpoint (` + example.Name + `, a tiny Qwen2-MoE with its
config and tokenizer) into DIR/` + example.Name + ` and example shard requests into
DIR/` + example.RequestsDir + `, nothing outside DIR, and prints curl commands for a server of that
store. DIR/` + example.RequestsDir + ` is not a checkpoint: the server does not list it.

Example (what 'make run' does):
  shardsrv example --out .run/checkpoints
  shardsrv serve --store .run/checkpoints
`

func writeExample(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("example", exampleUsage, stderr)
	out := fs.String("out", ".run/checkpoints", "the store `DIR` to write into")
	addr := fs.String("addr", "localhost:8080", "server address (`HOST:PORT`) the printed curl commands use")
	if err := parse(fs, args); err != nil {
		return err
	}
	requests, err := example.Generate(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(
		stdout,
		"Wrote checkpoint %s and its requests %s (serve them: shardsrv serve --store %s). Try:\n%s",
		filepath.Join(*out, example.Name),
		filepath.Join(*out, example.RequestsDir),
		*out,
		example.CurlExamples(*addr, requests),
	)
	return nil
}
