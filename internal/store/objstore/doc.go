// Package objstore is the store over an object store (S3, GCS, Azure Blob), written once in the
// manner of go-cloud's portable bucket: Store owns what every object store shares — key
// validation, the prefix keys live under, listing page by page, the store's name without secrets,
// errors that name the store and key and wrap store's sentinels, a missing bucket reported alike,
// and the read path: request slots, a timeout per attempt, a total retry budget, full-jitter
// backoff, and ranged reads whose broken bodies are resumed at the missing tail under the same
// version. A backend supplies only what its SDK knows (Backend): how to head an object, open a
// ranged body pinned to a version, list one page, check the bucket, and which errors are worth
// another attempt and which sentinel each stands for, by the SDK's own retry classification
// where it has one.
//
// # Adding a store
//
// A store is one package (internal/s3reader, internal/gcsstore and internal/azstore are the
// three there are): a Config of its bucket, its endpoint flags and Tunables; a ParseURL of its
// --store URL (ParseURL here, given the form); a New that builds the SDK's client, its retries
// off, and returns New(backend, Config); and the backend's six methods. Then one entry in
// cmd/shardsrv's objectStores table (its URL form, its flags, parse, open) makes --store take it.
// It passes the conformance suite (internal/store/storetest) and the fault matrix
// (faultproxy.RunMatrix) against its emulator.
//
// # Why not gocloud.dev/blob
//
// It would open all three stores behind one API, but its NewRangeReader takes no version, so
// pinning a read to the ETag or generation the catalog saw means reaching through BeforeRead and
// As() into each SDK's request type, three SDK-specific code paths behind the portable facade.
// Resuming a broken body is left to each SDK (Azure's retry reader and GCS's reader reopen, an S3
// body does not), under each SDK's own retries, where this server needs one budget per read and a
// cap on requests across all reads. Its errors come back as portable codes; telling a replaced
// object, a range past the end, throttling and refused credentials apart needs the SDK's error
// again (ErrorAs). What it would save, opening clients and listing, is the small part; the read
// path, the part that must be right, it does not cover. So the portable layer is this package,
// and a backend is the few functions each SDK needs anyway.
package objstore
