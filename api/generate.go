// Package api holds shardsrv's public wire types and chi server interface, generated from
// openapi.yaml, with the spec embedded for contract checks.
package api

//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../openapi.yaml
