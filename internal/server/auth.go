package server

import "strings"

// bearerToken reads an Authorization header: the scheme is matched regardless of case (RFC 9110
// §11.1), then one or more spaces and the token.
func bearerToken(header string) (string, bool) {
	scheme, rest, ok := strings.Cut(strings.TrimLeft(header, " "), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token := strings.Trim(rest, " \t")
	return token, token != ""
}
