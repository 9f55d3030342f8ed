package api_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A program that only wants the client must not pull in a router or an OpenAPI library.
func TestClientPackageHasNoServerDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, server := range []string{
			"github.com/go-chi/",
			"github.com/getkin/kin-openapi",
			"github.com/oapi-codegen/runtime",
		} {
			if strings.HasPrefix(dep, server) {
				t.Errorf("api depends on %s", dep)
			}
		}
	}
}
