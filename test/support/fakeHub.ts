import { createHash } from "node:crypto"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"

/**
 * A Hugging Face hub on 127.0.0.1 in the hub's URL scheme: `GET /api/models/{repo}/revision/{rev}`
 * lists a repository's files with their sizes and digests (as `?blobs=true` does), and
 * `GET /{repo}/resolve/{rev}/{path}` answers plain git files itself and redirects LFS files to a
 * second server (the CDN) on another port, as the real hub does. Faults can be injected per file.
 */

export interface FixtureFile {
  readonly path: string
  readonly bytes: Buffer
  /** Stored with Git LFS: listed with its sha256, served from the CDN. */
  readonly lfs: boolean
}

export interface FixtureRepo {
  readonly commit: string
  readonly files: ReadonlyArray<FixtureFile>
}

export interface SeenRequest {
  readonly server: "hub" | "cdn"
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
}

export interface FakeHub {
  readonly endpoint: string
  readonly requests: Array<SeenRequest>
  /** The next `times` transfers of `path` send `afterBytes` bytes, then drop the connection. */
  cut(path: string, afterBytes: number, times: number): void
  /** `path` is served with its first byte changed. */
  corrupt(path: string): void
  /** Every request needs `Authorization: Bearer <token>` (401 without, 403 with a wrong one). */
  requireToken(token: string | undefined): void
  clearFaults(): void
  close(): Promise<void>
}

const sha256 = (bytes: Buffer) => createHash("sha256").update(bytes).digest("hex")
const gitBlobId = (bytes: Buffer) => createHash("sha1").update(`blob ${bytes.length}\0`).update(bytes).digest("hex")

/** The pointer file git keeps in place of an LFS file; its blob id is what the hub lists as `blobId`. */
const lfsPointer = (file: FixtureFile) =>
  Buffer.from(
    `version https://git-lfs.github.com/spec/v1\noid sha256:${sha256(file.bytes)}\nsize ${file.bytes.length}\n`
  )

const listen = (server: Http.Server) =>
  new Promise<string>((resolve) =>
    server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`))
  )

const close = (server: Http.Server) =>
  new Promise<void>((resolve) => {
    server.closeAllConnections()
    server.close(() => resolve())
  })

export const startFakeHub = async (repos: Readonly<Record<string, FixtureRepo>>): Promise<FakeHub> => {
  const requests: Array<SeenRequest> = []
  const cuts = new Map<string, { afterBytes: number; times: number }>()
  const corrupted = new Set<string>()
  let token: string | undefined
  const byDigest = new Map<string, FixtureFile>()
  for (const repo of Object.values(repos)) for (const file of repo.files) byDigest.set(sha256(file.bytes), file)

  /** Sends `file` honouring `Range`, with the faults injected for it. */
  const sendFile = (request: Http.IncomingMessage, response: Http.ServerResponse, file: FixtureFile) => {
    let bytes = file.bytes
    if (corrupted.has(file.path)) {
      bytes = Buffer.from(bytes)
      bytes[0] = bytes[0]! ^ 0xff
    }
    let start = 0
    const range = /^bytes=(\d+)-$/.exec(request.headers.range ?? "")
    if (range !== null) {
      start = Number(range[1])
      if (start >= bytes.length) {
        response.writeHead(416, { "content-range": `bytes */${bytes.length}` }).end()
        return
      }
      response.writeHead(206, {
        "content-length": bytes.length - start,
        "content-range": `bytes ${start}-${bytes.length - 1}/${bytes.length}`
      })
    } else {
      response.writeHead(200, { "content-length": bytes.length })
    }
    const body = bytes.subarray(start)
    const cut = cuts.get(file.path)
    if (cut !== undefined && cut.times > 0) {
      cut.times--
      response.write(body.subarray(0, cut.afterBytes), () => response.socket?.destroy())
      return
    }
    response.end(body)
  }

  const authorized = (request: Http.IncomingMessage, response: Http.ServerResponse) => {
    if (token === undefined) return true
    const given = request.headers.authorization
    if (given === `Bearer ${token}`) return true
    response
      .writeHead(given === undefined ? 401 : 403, {
        "x-error-code": "RepoNotFound",
        "x-error-message": given === undefined ? "Invalid username or password." : "Access denied."
      })
      .end()
    return false
  }

  const notFound = (response: Http.ServerResponse, code: string) =>
    response.writeHead(404, { "x-error-code": code, "x-error-message": `${code}` }).end()

  const hub = Http.createServer((request, response) => {
    const url = new URL(request.url ?? "/", "http://hub")
    const path = decodeURIComponent(url.pathname)
    requests.push({ server: "hub", path: url.pathname + url.search, headers: request.headers })
    if (!authorized(request, response)) return
    const api = /^\/api\/models\/([^/]+\/[^/]+)\/revision\/(.+)$/.exec(path)
    if (api !== null) {
      const repo = repos[api[1]!]
      if (repo === undefined) return notFound(response, "RepoNotFound")
      if (api[2] !== "main" && api[2] !== repo.commit) return notFound(response, "RevisionNotFound")
      const listing = {
        id: api[1],
        sha: repo.commit,
        siblings: repo.files.map((file) => ({
          rfilename: file.path,
          size: file.bytes.length,
          blobId: gitBlobId(file.lfs ? lfsPointer(file) : file.bytes),
          ...(file.lfs ? { lfs: { sha256: sha256(file.bytes), size: file.bytes.length, pointerSize: 130 } } : {})
        }))
      }
      response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(listing))
      return
    }
    const resolve = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(path)
    if (resolve !== null) {
      const repo = repos[resolve[1]!]
      if (repo === undefined) return notFound(response, "RepoNotFound")
      if (resolve[2] !== "main" && resolve[2] !== repo.commit) return notFound(response, "RevisionNotFound")
      const file = repo.files.find((candidate) => candidate.path === resolve[3])
      if (file === undefined) return notFound(response, "EntryNotFound")
      if (file.lfs) {
        response
          .writeHead(302, {
            location: `${cdnUrl}/blobs/${sha256(file.bytes)}`,
            "x-repo-commit": repo.commit,
            "x-linked-etag": `"${sha256(file.bytes)}"`,
            "x-linked-size": String(file.bytes.length),
            etag: `"${gitBlobId(lfsPointer(file))}"`
          })
          .end()
        return
      }
      response.setHeader("x-repo-commit", repo.commit)
      response.setHeader("etag", `"${gitBlobId(file.bytes)}"`)
      sendFile(request, response, file)
      return
    }
    notFound(response, "RepoNotFound")
  })
  const cdn = Http.createServer((request, response) => {
    const url = new URL(request.url ?? "/", "http://cdn")
    requests.push({ server: "cdn", path: url.pathname, headers: request.headers })
    const file = byDigest.get(url.pathname.slice("/blobs/".length))
    if (file === undefined) return void response.writeHead(404).end()
    sendFile(request, response, file)
  })
  const endpoint = await listen(hub)
  const cdnUrl = await listen(cdn)
  return {
    endpoint,
    requests,
    cut: (path, afterBytes, times) => cuts.set(path, { afterBytes, times }),
    corrupt: (path) => corrupted.add(path),
    requireToken: (required) => {
      token = required
    },
    clearFaults: () => {
      cuts.clear()
      corrupted.clear()
      token = undefined
    },
    close: async () => {
      await Promise.all([close(hub), close(cdn)])
    }
  }
}

/** Deterministic bytes: a tiny stand-in for an ONNX graph or its data. */
export const fixtureBytes = (length: number, seed: number): Buffer => {
  const bytes = Buffer.alloc(length)
  let state = seed >>> 0 || 1
  for (let index = 0; index < length; index++) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0
    bytes[index] = state >>> 24
  }
  return bytes
}

const json = (value: unknown) => Buffer.from(`${JSON.stringify(value, null, 2)}\n`)

/** A decoder-only repository laid out like a community ONNX export: fp32 with external data, fp16 and q4. */
export const smolRepo = (): FixtureRepo => ({
  commit: "0123456789abcdef0123456789abcdef01234567",
  files: [
    { path: ".gitattributes", bytes: Buffer.from("*.onnx filter=lfs diff=lfs merge=lfs -text\n"), lfs: false },
    { path: "README.md", bytes: Buffer.from("# SmolLM2 (fixture)\n"), lfs: false },
    { path: "config.json", bytes: json({ model_type: "llama", hidden_size: 8, vocab_size: 16 }), lfs: false },
    { path: "generation_config.json", bytes: json({ eos_token_id: 2 }), lfs: false },
    { path: "tokenizer.json", bytes: json({ version: "1.0", model: { type: "BPE", vocab: {} } }), lfs: false },
    { path: "tokenizer_config.json", bytes: json({ eos_token: "</s>" }), lfs: false },
    { path: "special_tokens_map.json", bytes: json({ eos_token: "</s>" }), lfs: false },
    { path: "chat_template.jinja", bytes: Buffer.from("{{ messages[0].content }}"), lfs: false },
    { path: "onnx/model.onnx", bytes: fixtureBytes(48 * 1024, 1), lfs: true },
    { path: "onnx/model.onnx_data", bytes: fixtureBytes(96 * 1024, 2), lfs: true },
    { path: "onnx/model_fp16.onnx", bytes: fixtureBytes(24 * 1024, 3), lfs: true },
    { path: "onnx/model_q4.onnx", bytes: fixtureBytes(12 * 1024, 4), lfs: true }
  ]
})
