// Package api is shardsrv's public Go face: the wire types, generated from openapi.yaml, and a
// client. It carries no server code: the router and the embedded spec are internal/server/gen.
package api

//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../openapi.yaml
