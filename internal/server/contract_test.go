package server_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/server/gen"
	"github.com/shardsrv/shardsrv/internal/store"
)

func TestSpecIsValidAndEmbedded(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../../openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml does not validate: %v", err)
	}
	embedded, err := gen.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	// oapi-codegen capitalises operation ids in the spec it embeds; nothing else may differ.
	for _, d := range []*openapi3.T{doc, embedded} {
		for _, item := range d.Paths.Map() {
			for _, op := range item.Operations() {
				op.OperationID = strings.ToLower(op.OperationID)
			}
		}
	}
	a, _ := doc.MarshalJSON()
	b, _ := embedded.MarshalJSON()
	if string(a) != string(b) {
		t.Error("api/api.gen.go is older than openapi.yaml: run 'make generate'")
	}
}

func TestRoutesMatchSpec(t *testing.T) {
	spec, _ := gen.GetSwagger()
	want := map[string]bool{}
	for path, item := range spec.Paths.Map() {
		for method := range item.Operations() {
			want[method+" "+path] = true
		}
	}
	st, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Executor: executor.New(st, budget.New(budget.Config{}),
		executor.Config{})})
	var got []string
	err = chi.Walk(
		srv.Handler().(chi.Routes),
		func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
			got = append(got, method+" "+route)
			if !want[method+" "+route] {
				t.Errorf("route %s %s is not in openapi.yaml", method, route)
			}
			return nil
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	for op := range want {
		if !slices.Contains(got, op) {
			t.Errorf("openapi.yaml has %s, which the router does not serve", op)
		}
	}
	if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "POST /v1/shards") }) {
		t.Error("no shard route")
	}
}
