import { closeSync, existsSync, fstatSync, ftruncateSync, openSync, rmSync, unlinkSync, writeSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import type mmapModule from "@riaskov/mmap-io"
import * as Effect from "effect/Effect"
import { ArenaUnavailable } from "./errors.js"

/**
 * The node's shared memory: one file in /dev/shm, mapped by the sidecar and by every executor
 * process of the node, so a tensor written by one is read in place by another.
 *
 * The file is mapped in segments because a Node 20 Buffer holds at most 4 GiB; the allocator's
 * largest block is the segment size and blocks are aligned to their size, so no tensor straddles
 * two segments.
 *
 * The file's size is the arena's bound, but the file is sparse: it holds memory only where its
 * creator committed some, in steps, as it hands out the bytes (`commit`). Every process maps the
 * whole file once, so growing moves nothing a reader has mapped. A step is committed by writing
 * zeros into it with write(2), which fails with ENOSPC when /dev/shm is full, rather than by
 * touching the mapping, which would kill the process with SIGBUS in the middle of a transfer.
 */

/** Every arena file's name starts with this, so a leftover one is easy to recognise. */
export const arenaFilePrefix = "cornserve-arena-"

const defaultSegmentBytes = 2 ** 31

/** The arena grows in steps of this many bytes, each committed once. */
export const commitStepBytes = 64 * 1024

/** Zeros written at once while committing. */
const zeroRunBytes = 1024 * 1024

type Mmap = typeof mmapModule.default

/**
 * mmap-io's native binding, loaded from its file on first use. The package's own entry finds that
 * file through node-pre-gyp, which loads about forty modules (npmlog, semver, gauge, ...) to do it:
 * about 70 ms of CPU in every process that maps the arena (the sidecar, each executor router and
 * worker), on the path of every cold start. The paths are the two the package's install writes
 * (its prebuilt binary, or a build from source); anything else falls back to the package's entry.
 */
let loadedMmap: Mmap | undefined
const mmapBinding = (): Mmap => {
  if (loadedMmap !== undefined) return loadedMmap
  const require = createRequire(import.meta.url)
  const root = dirname(require.resolve("@riaskov/mmap-io/package.json"))
  const abi = `node-v${process.versions.modules}-${process.platform}-${process.arch}`
  const binary = [
    join(root, "build", "binding", "Release", abi, "mmap_io.node"),
    join(root, "build", "Release", "mmap_io.node")
  ].find((path) => existsSync(path))
  // The package's typings declare a default export, but at run time the CommonJS module itself is the API.
  loadedMmap = (binary === undefined ? require("@riaskov/mmap-io") : require(binary)) as Mmap
  return loadedMmap
}

const describe = (error: unknown) => {
  if ((error as NodeJS.ErrnoException).code === "EEXIST") {
    return "the file exists already: another sidecar uses it, or one was killed before it could remove it"
  }
  return error instanceof Error ? error.message : String(error)
}

export class Arena {
  private constructor(
    readonly path: string,
    readonly byteLength: number,
    readonly segmentBytes: number,
    private readonly segments: ReadonlyArray<Buffer>,
    private readonly growth?: Growth
  ) {}

  /**
   * Creates the arena file, `byteLength` bytes of which none is committed yet, and maps it. The
   * file is unlinked when the scope closes, and on any process exit before that.
   */
  static create(path: string, byteLength: number, segmentBytes = defaultSegmentBytes) {
    return Effect.acquireRelease(
      Effect.try({
        try: () => {
          // Exclusive: a file already there belongs to a running sidecar or to one that was killed.
          const fd = openSync(path, "wx+", 0o600)
          try {
            ftruncateSync(fd, byteLength)
            const segments = mapSegments(fd, byteLength, segmentBytes)
            return new Arena(path, byteLength, segmentBytes, segments, new Growth(fd, byteLength))
          } catch (error) {
            closeSync(fd)
            rmSync(path, { force: true })
            throw error
          }
        },
        catch: (error) => new ArenaUnavailable({ path, reason: describe(error) })
      }).pipe(
        Effect.map((arena) => {
          const unlinkOnExit = () => rmSync(path, { force: true })
          process.once("exit", unlinkOnExit)
          return { arena, unlinkOnExit }
        })
      ),
      ({ arena, unlinkOnExit }) =>
        Effect.sync(() => {
          process.off("exit", unlinkOnExit)
          arena.growth?.close()
          unlinkSync(path)
        })
    ).pipe(Effect.map(({ arena }) => arena))
  }

  /** Maps an arena that a sidecar created (executors do this once they know its path). */
  static open(path: string, segmentBytes = defaultSegmentBytes): Arena {
    try {
      const fd = openSync(path, "r+")
      try {
        const byteLength = fstatSync(fd).size
        return new Arena(path, byteLength, segmentBytes, mapSegments(fd, byteLength, segmentBytes))
      } finally {
        closeSync(fd)
      }
    } catch (error) {
      throw new ArenaUnavailable({ path, reason: describe(error) })
    }
  }

  /** The bytes of the file that hold memory. */
  get committedBytes(): number {
    return this.growth?.committedBytes ?? 0
  }

  /**
   * Commits the steps of [offset, offset + length) not committed yet, before the bytes are handed
   * out: false when /dev/shm has no room for them. Only the creator commits, and a step is
   * committed before anyone may write into it, so its zeros overwrite nothing.
   */
  commit(offset: number, length: number): boolean {
    if (this.growth === undefined) throw new Error(`the arena ${this.path} grows in the process that created it`)
    if (offset < 0 || length < 0 || offset + length > this.byteLength) {
      throw new RangeError(`bytes [${offset}, ${offset + length}) are not within the arena ${this.path}`)
    }
    return this.growth.commit(offset, length)
  }

  /** Where `view` starts in the arena, or undefined when it is not memory of this mapping. */
  offsetOf(view: Uint8Array): number | undefined {
    const segment = this.segments.findIndex((buffer) => buffer.buffer === view.buffer)
    if (segment === -1) return undefined
    return segment * this.segmentBytes + view.byteOffset - this.segments[segment]!.byteOffset
  }

  /** The bytes [offset, offset + length) of the arena, without copying. */
  view(offset: number, length: number): Buffer {
    const segment = Math.floor(offset / this.segmentBytes)
    const start = offset - segment * this.segmentBytes
    const buffer = this.segments[segment]
    if (buffer === undefined || start + length > buffer.length) {
      throw new RangeError(`bytes [${offset}, ${offset + length}) are not within one segment of the arena ${this.path}`)
    }
    return buffer.subarray(start, start + length)
  }
}

/** The creator's side of a sparse file: which steps hold memory, and the descriptor it writes them through. */
class Growth {
  private readonly committed: Uint8Array
  private zeros: Buffer | undefined
  committedBytes = 0

  constructor(
    private fd: number | undefined,
    private readonly byteLength: number
  ) {
    this.committed = new Uint8Array(Math.ceil(byteLength / commitStepBytes))
  }

  commit(offset: number, length: number): boolean {
    const last = Math.ceil((offset + length) / commitStepBytes)
    let step = Math.floor(offset / commitStepBytes)
    while (step < last) {
      if (this.committed[step] === 1) {
        step++
        continue
      }
      let end = step
      while (end < last && this.committed[end] === 0) end++
      if (!this.write(step * commitStepBytes, Math.min(end * commitStepBytes, this.byteLength))) return false
      this.committed.fill(1, step, end)
      step = end
    }
    return true
  }

  close(): void {
    if (this.fd !== undefined) closeSync(this.fd)
    this.fd = undefined
  }

  private write(from: number, to: number): boolean {
    if (this.fd === undefined) return false
    this.zeros ??= Buffer.alloc(zeroRunBytes)
    try {
      for (let at = from; at < to; ) at += writeSync(this.fd, this.zeros, 0, Math.min(zeroRunBytes, to - at), at)
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOSPC") return false
      throw error
    }
    this.committedBytes += to - from
    return true
  }
}

/** PROT_READ | PROT_WRITE, which the typings list as a literal. */
const readWrite = 3

/** Shared, not populated: populating would fill the whole sparse file with memory. */
const mapSegments = (fd: number, byteLength: number, segmentBytes: number): ReadonlyArray<Buffer> => {
  const mmap = mmapBinding()
  const flags = mmap.MAP_SHARED
  const segments: Array<Buffer> = []
  for (let offset = 0; offset < byteLength; offset += segmentBytes) {
    segments.push(mmap.map(Math.min(segmentBytes, byteLength - offset), readWrite, flags, fd, offset))
  }
  return segments
}
