# Multi-stage build: a static binary on an empty base, running as a non-root user.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/shardsrv ./cmd/shardsrv

FROM scratch
# CA certificates for TLS to S3; nothing else is in the image.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/shardsrv /shardsrv
USER 65532:65532
EXPOSE 8080
# The binary is the entrypoint, so one image serves (the chart passes serve) and fetches (an init
# container passes fetch ...); with no arguments it serves.
ENTRYPOINT ["/shardsrv"]
CMD ["serve"]
