package jsonbody

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// schemaError finds where a JSON body breaks the shape of the Go type it decodes into: the first
// unknown field or value of the wrong JSON type, as a JSON pointer with array indices and a detail
// in JSON's words (never a Go type name). encoding/json reports neither the index of an unknown
// field nor, for type errors, every array index on the way.
func schemaError(body []byte, t reflect.Type) (pointer, detail string, ok bool) {
	var raw any
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	if dec.Decode(&raw) != nil {
		return "", "", false
	}
	return walk(raw, t, "")
}

func walk(v any, t reflect.Type, ptr string) (string, string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil { // null leaves any Go value as it is
		return "", "", false
	}
	want := jsonKind(t)
	if got := jsonKindOf(v); want != "" && got != want && !(want == "integer" && got == "number") {
		return ptrOr(ptr), fmt.Sprintf("expected %s, got %s", article(want), article(got)), true
	}
	switch t.Kind() {
	case reflect.Struct:
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" {
				fields[name] = f.Type
			}
		}
		obj := v.(map[string]any)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, known := fields[k]
			if !known {
				detail := fmt.Sprintf("unknown field %q; this object takes %s", k, fieldList(fields))
				return ptr + "/" + escape(k), detail, true
			}
			if p, d, ok := walk(obj[k], ft, ptr+"/"+escape(k)); ok {
				return p, d, true
			}
		}
	case reflect.Slice, reflect.Array:
		for i, e := range v.([]any) {
			if p, d, ok := walk(e, t.Elem(), fmt.Sprintf("%s/%d", ptr, i)); ok {
				return p, d, true
			}
		}
	case reflect.Map:
		for k, e := range v.(map[string]any) {
			if p, d, ok := walk(e, t.Elem(), ptr+"/"+escape(k)); ok {
				return p, d, true
			}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n := reflect.New(t)
		if json.Unmarshal([]byte(v.(json.Number).String()), n.Interface()) != nil {
			return ptrOr(ptr), fmt.Sprintf("%s is not an integer this field can hold", v), true
		}
	}
	return "", "", false
}

func jsonKind(t reflect.Type) string {
	if t == reflect.TypeFor[json.Number]() {
		return "number"
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	}
	return "" // interfaces and the like take anything
}

func jsonKindOf(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	}
	return "number"
}

func article(kind string) string {
	if kind == "object" || kind == "array" || kind == "integer" {
		return "an " + kind
	}
	return "a " + kind
}

func fieldList(fields map[string]reflect.Type) string {
	names := make([]string, 0, len(fields))
	for n := range fields {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func ptrOr(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

// escape escapes a key for a JSON pointer (RFC 6901).
func escape(k string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(k) }
