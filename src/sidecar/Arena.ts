import { closeSync, fstatSync, ftruncateSync, openSync, rmSync, statfsSync, unlinkSync } from "node:fs"
import { dirname } from "node:path"
import mmapModule from "@riaskov/mmap-io"
import { Effect } from "effect"
import { ArenaUnavailable } from "./errors.js"

/**
 * The node's shared memory: one file in /dev/shm, mapped by the sidecar and by every executor
 * process of the node, so a tensor written by one is read in place by another.
 *
 * The file is mapped in segments because a Node 20 Buffer holds at most 4 GiB; the allocator's
 * largest block is the segment size and blocks are aligned to their size, so no tensor straddles
 * two segments.
 */

/** Every arena file's name starts with this, so a leftover one is easy to recognise. */
export const arenaFilePrefix = "cornserve-arena-"

const defaultSegmentBytes = 2 ** 31

// The package's typings declare a default export, but at run time the CommonJS module itself is the API.
const mmap = mmapModule as unknown as typeof mmapModule.default

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
    private readonly segments: ReadonlyArray<Buffer>
  ) {}

  /**
   * Creates the arena file and maps it. The pages are populated up front: the memory is committed
   * when the sidecar starts rather than failing (SIGBUS) in the middle of a transfer. The file is
   * unlinked when the scope closes, and on any process exit before that.
   */
  static create(path: string, byteLength: number, segmentBytes = defaultSegmentBytes) {
    return Effect.acquireRelease(
      Effect.try({
        try: () => {
          const available = statfsSync(dirname(path))
          const availableBytes = available.bavail * available.bsize
          if (availableBytes < byteLength) {
            throw new Error(`${dirname(path)} has ${availableBytes} bytes free, ${byteLength} were asked for`)
          }
          // Exclusive: a file already there belongs to a running sidecar or to one that was killed.
          const fd = openSync(path, "wx+", 0o600)
          try {
            ftruncateSync(fd, byteLength)
            return new Arena(path, byteLength, segmentBytes, mapSegments(fd, byteLength, segmentBytes))
          } catch (error) {
            rmSync(path, { force: true })
            throw error
          } finally {
            closeSync(fd)
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
      ({ unlinkOnExit }) =>
        Effect.sync(() => {
          process.off("exit", unlinkOnExit)
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

/** PROT_READ | PROT_WRITE, which the typings list as a literal. */
const readWrite = 3

/** Shared, and populated: a process fills its page tables once rather than faulting on a transfer's path. */
const mapSegments = (fd: number, byteLength: number, segmentBytes: number): ReadonlyArray<Buffer> => {
  const flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
  const segments: Array<Buffer> = []
  for (let offset = 0; offset < byteLength; offset += segmentBytes) {
    segments.push(mmap.map(Math.min(segmentBytes, byteLength - offset), readWrite, flags, fd, offset))
  }
  return segments
}
