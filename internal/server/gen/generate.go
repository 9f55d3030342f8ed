// Package gen is the server side of openapi.yaml, generated: the chi router for every route and
// the embedded spec the contract tests check responses against. The wire types live in api, which
// clients import without this package's router and OpenAPI dependencies.
package gen

//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../../../openapi.yaml
