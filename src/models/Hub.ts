import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { mkdir, open, readdir, readFile, rename, rm, rmdir, stat, writeFile } from "node:fs/promises"
import { homedir } from "node:os"
import { dirname, join } from "node:path"
import { type Dtype, dtypePreference, parseOnnxFileName } from "./Dtype.js"
import { type Digest, digestKey, downloadFile, getJson, type HubClient } from "./HubTransfer.js"
import { DtypeUnavailable, HubRequestFailed, ModelOffline } from "./ModelErrors.js"

/**
 * Models named the way the Hugging Face hub names them (`org/name`, or `org/name@revision`): found
 * on this machine, in Cornserve's model directory or in an existing Hugging Face cache, or else
 * downloaded from the hub into `<model dir>/<org>/<name>`, the layout transformers.js reads with
 * `env.localModelPath`. A download fetches the configuration, tokenizer and template files and the
 * ONNX graphs of one precision only, and records what it finished in `.cornserve-download.json`: a
 * directory whose record does not list the precision asked for is resumed, never used.
 */

export interface HubModelRef {
  readonly repo: string
  readonly revision: string
}

const namePart = /^[A-Za-z0-9][\w.-]{0,95}$/

/** `org/name` or `org/name@revision` as the hub spells repository ids, or undefined for anything else. */
export const parseHubId = (id: string): HubModelRef | undefined => {
  const at = id.indexOf("@")
  const repo = at < 0 ? id : id.slice(0, at)
  const revision = at < 0 ? "main" : id.slice(at + 1)
  const parts = repo.split("/")
  if (parts.length !== 2 || !parts.every((part) => namePart.test(part) && !/--|\.\./.test(part))) return undefined
  if (!/^[\w./-]{1,200}$/.test(revision) || revision.includes("..")) return undefined
  return { repo, revision }
}

export const hubEndpoint = (): string => (process.env.HF_ENDPOINT || "https://huggingface.co").replace(/\/+$/, "")

export const hubToken = (): string | undefined => process.env.HF_TOKEN || undefined

/** Whether HF_HUB_OFFLINE turns downloads off, as it does for the Hugging Face libraries. */
export const hubOfflineByEnvironment = (): boolean =>
  ["1", "true", "yes", "on"].includes((process.env.HF_HUB_OFFLINE ?? "").trim().toLowerCase())

/** Where the Hugging Face libraries keep their downloads (`models--org--name/snapshots/<commit>`). */
export const huggingFaceCacheDir = (): string =>
  process.env.HF_HUB_CACHE ||
  (process.env.HF_HOME ? join(process.env.HF_HOME, "hub") : join(homedir(), ".cache", "huggingface", "hub"))

/** The directory a hub model is downloaded into under `root`. */
export const hubModelDir = (ref: HubModelRef, root: string): string =>
  join(root, ...ref.repo.split("/")) + (ref.revision === "main" ? "" : `@${encodeURIComponent(ref.revision)}`)

export type ModelDownloadEvent =
  /** Another process is downloading the same model; this one waits for it. */
  | { readonly _tag: "Waiting"; readonly id: string; readonly pid: number }
  /** What the download fetches: files not already on disk, and their bytes when the hub lists sizes. */
  | {
      readonly _tag: "Fetching"
      readonly id: string
      readonly dir: string
      readonly commit: string
      readonly dtype: Dtype
      readonly files: number
      readonly bytes: number
    }
  | {
      readonly _tag: "Progress"
      readonly id: string
      readonly file: string
      readonly bytes: number
      readonly total: number | undefined
      readonly overallBytes: number
      readonly overallTotal: number
    }
  /** A file is whole and in place; `check` says how it was verified ("sha256", "git-sha1" or "size"). */
  | { readonly _tag: "Verified"; readonly id: string; readonly file: string; readonly check: string }

export interface HubResolveOptions {
  /** The ONNX precision; by default fp32, or the least lossy one the model has. */
  readonly dtype?: Dtype | undefined
  /** Refuse to download (also HF_HUB_OFFLINE=1). */
  readonly offline?: boolean | undefined
  /** Ask the hub for its newest files even when the model is already here (`cornserve models pull`). */
  readonly refresh?: boolean | undefined
  readonly onEvent?: ((event: ModelDownloadEvent) => void) | undefined
}

const recordFile = ".cornserve-download.json"
const lockFile = ".cornserve-download.lock"

const DownloadRecord = Schema.Struct({
  id: Schema.String,
  revision: Schema.String,
  commit: Schema.String,
  /** The precisions whose every file is here and verified. */
  dtypes: Schema.Array(Schema.String),
  /** Each file here, by repository path, with the digest it was verified against. */
  files: Schema.Record({ key: Schema.String, value: Schema.String })
})
type DownloadRecord = typeof DownloadRecord.Type

const readRecord = async (dir: string): Promise<DownloadRecord | undefined> => {
  const text = await readFile(join(dir, recordFile), "utf8").catch(() => undefined)
  if (text === undefined) return undefined
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return undefined
  }
  return Either.getOrUndefined(Schema.decodeUnknownEither(DownloadRecord)(value))
}

const writeRecord = async (dir: string, record: DownloadRecord) => {
  const staging = join(dir, `${recordFile}.${process.pid}`)
  await writeFile(staging, `${JSON.stringify(record, null, 2)}\n`)
  await rename(staging, join(dir, recordFile))
}

const exists = (path: string) =>
  stat(path).then(
    () => true,
    () => false
  )

/** The precisions of the ONNX graphs in `dir/onnx`, least lossy first. */
const dtypesIn = async (dir: string): Promise<ReadonlyArray<Dtype>> => {
  const files = await readdir(join(dir, "onnx")).catch(() => [] as Array<string>)
  const found = new Set(files.map((file) => parseOnnxFileName(file)?.dtype))
  return dtypePreference.filter((dtype) => found.has(dtype))
}

/**
 * Whether `dir` can be used as model `id` at `dtype`: a finished download that lists it, or a
 * directory placed there by hand (a config.json and no download record) that has it.
 */
const usableHere = async (dir: string, id: string, dtype: Dtype | undefined): Promise<boolean> => {
  const record = await readRecord(dir)
  if (record !== undefined) return dtype === undefined ? record.dtypes.length > 0 : record.dtypes.includes(dtype)
  if (!(await exists(join(dir, "config.json")))) return false
  if (dtype !== undefined) {
    const available = await dtypesIn(dir)
    if (!available.includes(dtype)) throw new DtypeUnavailable({ id, dtype, available })
  }
  return true
}

/** The snapshot of `ref` in the Hugging Face cache, when it holds a config and ONNX graphs at `dtype`. */
const huggingFaceSnapshot = async (ref: HubModelRef, dtype: Dtype | undefined): Promise<string | undefined> => {
  const repoDir = join(huggingFaceCacheDir(), `models--${ref.repo.replace("/", "--")}`)
  const commit = /^[0-9a-f]{40}$/.test(ref.revision)
    ? ref.revision
    : (await readFile(join(repoDir, "refs", ref.revision), "utf8").catch(() => "")).trim()
  if (commit === "") return undefined
  const snapshot = join(repoDir, "snapshots", commit)
  if (!(await exists(join(snapshot, "config.json")))) return undefined
  const available = await dtypesIn(snapshot)
  return (dtype === undefined ? available.length > 0 : available.includes(dtype)) ? snapshot : undefined
}

const Sibling = Schema.Struct({
  rfilename: Schema.String,
  size: Schema.optional(Schema.Number),
  blobId: Schema.optional(Schema.String),
  lfs: Schema.optional(Schema.Struct({ sha256: Schema.String, size: Schema.optional(Schema.Number) }))
})
type Sibling = typeof Sibling.Type

/** `GET /api/models/{repo}/revision/{revision}?blobs=true`: the commit and every file with its size and digest. */
const RepoListing = Schema.Struct({ sha: Schema.String, siblings: Schema.Array(Sibling) })

const listRepo = async (client: HubClient, ref: HubModelRef) => {
  const url = `${client.endpoint}/api/models/${ref.repo}/revision/${encodeURIComponent(ref.revision)}?blobs=true`
  const value = await getJson(client, url, `the listing of revision ${ref.revision}`)
  return Either.getOrThrowWith(
    Schema.decodeUnknownEither(RepoListing)(value),
    () =>
      new HubRequestFailed({ id: client.id, endpoint: client.endpoint, reason: "the hub's file listing is malformed" })
  )
}

const siblingDigest = (sibling: Sibling): Digest | undefined =>
  sibling.lfs !== undefined
    ? { algorithm: "sha256", value: sibling.lfs.sha256 }
    : sibling.blobId !== undefined
      ? { algorithm: "git-sha1", value: sibling.blobId }
      : undefined

const siblingSize = (sibling: Sibling) => sibling.lfs?.size ?? sibling.size

/** The stems a merged decoder makes redundant (the older export's separate first-step and with-past graphs). */
const replacedByMergedDecoder = new Set(["decoder_model", "decoder_with_past_model"])

/**
 * The files a model needs at one precision: the top-level JSON and Jinja files (configs, tokenizer,
 * chat template), and every onnx/ graph at that precision with its external data files
 * (`<graph>.onnx_data`, `<graph>.onnx_data_1`, ...).
 */
export const chooseFiles = (
  id: string,
  files: ReadonlyArray<string>,
  dtype: Dtype | undefined
): { readonly dtype: Dtype; readonly files: ReadonlyArray<string> } => {
  const supporting = files.filter((file) => !file.includes("/") && /\.(json|jinja)$/.test(file))
  const onnxDir = files.filter((file) => file.startsWith("onnx/") && file.split("/").length === 2)
  const graphs = onnxDir.flatMap((file) => {
    const parsed = parseOnnxFileName(file.slice("onnx/".length))
    return parsed === undefined ? [] : [{ file, ...parsed }]
  })
  const available = dtypePreference.filter((candidate) => graphs.some((graph) => graph.dtype === candidate))
  const chosen = dtype ?? available[0]
  if (chosen === undefined || !available.includes(chosen)) {
    throw new DtypeUnavailable({ id, dtype: chosen ?? "any", available })
  }
  let atDtype = graphs.filter((graph) => graph.dtype === chosen)
  if (atDtype.some((graph) => graph.stem === "decoder_model_merged")) {
    atDtype = atDtype.filter((graph) => !replacedByMergedDecoder.has(graph.stem))
  }
  const external = (graph: string) =>
    onnxDir.filter((file) => file.startsWith(`${graph}_data`) && /^_data(_\d+)?$/.test(file.slice(graph.length)))
  return {
    dtype: chosen,
    files: [...supporting.sort(), ...atDtype.flatMap((graph) => [graph.file, ...external(graph.file).sort()])]
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const processAlive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM"
  }
}

/**
 * Runs `body` holding the download lock of `dir`, so that two processes (or two deployments in one)
 * never write the same part files. A lock whose process is gone is taken over.
 */
const withDownloadLock = async <A>(
  dir: string,
  id: string,
  onEvent: (event: ModelDownloadEvent) => void,
  body: () => Promise<A>
): Promise<A> => {
  const path = join(dir, lockFile)
  let reportedWait = false
  for (;;) {
    try {
      const handle = await open(path, "wx")
      await handle.writeFile(String(process.pid))
      await handle.close()
      break
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error
    }
    const holder = Number.parseInt(await readFile(path, "utf8").catch(() => ""), 10)
    if (Number.isInteger(holder) && holder > 0) {
      if (processAlive(holder)) {
        if (!reportedWait) onEvent({ _tag: "Waiting", id, pid: holder })
        reportedWait = true
        await sleep(200)
      } else {
        await rm(path, { force: true })
      }
      continue
    }
    // An empty lock: its holder has just created it, or died before writing its pid.
    const age = await stat(path).then(
      (info) => Date.now() - info.mtimeMs,
      () => 0
    )
    if (age > 2_000) await rm(path, { force: true })
    else await sleep(50)
  }
  try {
    return await body()
  } finally {
    await rm(path, { force: true })
  }
}

const download = async (
  id: string,
  ref: HubModelRef,
  dir: string,
  options: HubResolveOptions,
  onEvent: (event: ModelDownloadEvent) => void
): Promise<void> => {
  const client: HubClient = { id, endpoint: hubEndpoint(), token: hubToken() }
  const listing = await listRepo(client, ref)
  const bySibling = new Map(listing.siblings.map((sibling) => [sibling.rfilename, sibling]))
  const plan = chooseFiles(id, [...bySibling.keys()], options.dtype)
  const previous = await readRecord(dir)
  let record: DownloadRecord = {
    id,
    revision: ref.revision,
    commit: listing.sha,
    // A new commit may have changed any file: no precision counts as finished until checked again.
    dtypes: previous?.commit === listing.sha ? previous.dtypes.filter((dtype) => dtype !== plan.dtype) : [],
    files: previous?.files ?? {}
  }
  // Written before any file arrives: a directory with a record but not the precision is unfinished.
  await writeRecord(dir, record)
  const missing: Array<string> = []
  for (const file of plan.files) {
    const sibling = bySibling.get(file)!
    const here = record.files[file] === digestKey(siblingDigest(sibling), siblingSize(sibling))
    if (!here || !(await exists(join(dir, file)))) missing.push(file)
  }
  const overallTotal = missing.reduce((sum, file) => sum + (siblingSize(bySibling.get(file)!) ?? 0), 0)
  onEvent({
    _tag: "Fetching",
    id,
    dir,
    commit: listing.sha,
    dtype: plan.dtype,
    files: missing.length,
    bytes: overallTotal
  })
  let finishedBytes = 0
  for (const file of missing) {
    const sibling = bySibling.get(file)!
    const size = siblingSize(sibling)
    const checked = await downloadFile(client, {
      url: `${client.endpoint}/${ref.repo}/resolve/${encodeURIComponent(ref.revision)}/${file.split("/").map(encodeURIComponent).join("/")}`,
      target: join(dir, file),
      file,
      size,
      digest: siblingDigest(sibling),
      onBytes: (bytes) =>
        onEvent({
          _tag: "Progress",
          id,
          file,
          bytes,
          total: size,
          overallBytes: finishedBytes + bytes,
          overallTotal
        })
    })
    finishedBytes += size ?? 0
    record = { ...record, files: { ...record.files, [file]: digestKey(checked, size) } }
    await writeRecord(dir, record)
    onEvent({ _tag: "Verified", id, file, check: checked?.algorithm ?? "size" })
  }
  await writeRecord(dir, { ...record, dtypes: [...record.dtypes, plan.dtype] })
}

/**
 * The directory of hub model `id` (parsed as `ref`) at `options.dtype`: a finished download under
 * `root`, else a Hugging Face cache snapshot, else a fresh download into `hubModelDir(ref, root)`
 * (refused when offline).
 */
export const resolveHubModel = async (
  id: string,
  ref: HubModelRef,
  root: string,
  options: HubResolveOptions = {}
): Promise<string> => {
  const dir = hubModelDir(ref, root)
  const onEvent = options.onEvent ?? (() => {})
  const offline = options.offline === true || hubOfflineByEnvironment()
  if (!options.refresh || offline) {
    if (await usableHere(dir, id, options.dtype)) return dir
    const snapshot = await huggingFaceSnapshot(ref, options.dtype)
    if (snapshot !== undefined) return snapshot
  }
  if (offline) {
    throw new ModelOffline({
      id,
      searched: [dir, join(huggingFaceCacheDir(), `models--${ref.repo.replace("/", "--")}`)]
    })
  }
  await mkdir(dir, { recursive: true })
  try {
    await withDownloadLock(dir, id, onEvent, async () => {
      // Another process may have finished it while this one waited for the lock.
      if (!options.refresh && (await usableHere(dir, id, options.dtype))) return
      await download(id, ref, dir, options, onEvent)
    })
  } catch (error) {
    // A model the hub does not have (a misspelt id) leaves no empty directory behind; rmdir
    // removes only an empty one, and never what another download left there.
    await rmdir(dir)
      .then(
        () => rmdir(dirname(dir)),
        () => undefined
      )
      .catch(() => undefined)
    throw error
  }
  return dir
}
