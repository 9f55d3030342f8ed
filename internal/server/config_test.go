package server_test

import (
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// New refuses what Validate does: a zero Config has neither of the two required parts, and a
// negative limit is no default.
func TestNewRefusesWhatValidateRefuses(t *testing.T) {
	st, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ex := executor.New(st, budget.New(budget.Config{}), executor.Config{})
	for name, c := range map[string]struct {
		cfg  server.Config
		want string
	}{
		"zero":           {server.Config{}, "a catalog and an executor"},
		"no executor":    {server.Config{Catalog: checkpoint.New(st)}, "a catalog and an executor"},
		"negative limit": {server.Config{Catalog: checkpoint.New(st), Executor: ex, Limits: server.Limits{MaxStreams: -1}}, "--max-streams"},
	} {
		func() {
			defer func() {
				if v, _ := recover().(string); !strings.Contains(v, c.want) {
					t.Errorf("%s: New panicked with %q, want it to name %q", name, v, c.want)
				}
			}()
			server.New(c.cfg)
		}()
	}
}
