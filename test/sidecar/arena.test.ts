import { existsSync, statSync } from "node:fs"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { Arena, arenaFilePrefix, commitStepBytes } from "../../src/sidecar/Arena.js"
import { SizeClassAllocator } from "../../src/sidecar/SizeClassAllocator.js"
import { SlotPool } from "../../src/sidecar/SlotPool.js"

const KiB = 1024
const MiB = 1024 * KiB

const arenaPath = () => `/dev/shm/${arenaFilePrefix}test-${process.pid}-${Math.random().toString(36).slice(2)}`

/** The memory the file holds, as the kernel counts it (a sparse file holds none for its holes). */
const heldBytes = (path: string) => statSync(path).blocks * 512

describe("Arena", () => {
  it.scoped("holds no memory until bytes are committed, then only the steps they touch", () =>
    Effect.gen(function* () {
      const path = arenaPath()
      const arena = yield* Arena.create(path, 64 * MiB)
      expect(arena.byteLength).toBe(64 * MiB)
      expect(arena.committedBytes).toBe(0)
      expect(heldBytes(path)).toBe(0)
      // 100 KiB from 1 MiB - 1 KiB touches three steps.
      expect(arena.commit(MiB - KiB, 100 * KiB)).toBe(true)
      expect(arena.committedBytes).toBe(3 * commitStepBytes)
      expect(heldBytes(path)).toBe(3 * commitStepBytes)
      // Committed steps are not committed again.
      expect(arena.commit(MiB, 4 * KiB)).toBe(true)
      expect(arena.committedBytes).toBe(3 * commitStepBytes)
    })
  )

  it.scoped("grows under a process that mapped it before: the reader sees what is written after, in place", () =>
    Effect.gen(function* () {
      const path = arenaPath()
      const arena = yield* Arena.create(path, 16 * MiB)
      const reader = Arena.open(path)
      expect(reader.byteLength).toBe(16 * MiB)
      const offset = 8 * MiB
      expect(arena.commit(offset, 2 * MiB)).toBe(true)
      arena.view(offset, 2 * MiB).fill(7)
      expect(reader.view(offset, 2 * MiB).every((byte) => byte === 7)).toBe(true)
      // Growing around written bytes leaves them as they are: only new steps get zeros.
      expect(arena.commit(offset - MiB, 4 * MiB)).toBe(true)
      expect(arena.committedBytes).toBe(4 * MiB)
      expect(reader.view(offset, 2 * MiB).every((byte) => byte === 7)).toBe(true)
      expect(reader.view(offset - MiB, MiB).every((byte) => byte === 0)).toBe(true)
    })
  )

  it.scoped("commits within its bound only, and only in the process that created it", () =>
    Effect.gen(function* () {
      const path = arenaPath()
      const arena = yield* Arena.create(path, 4 * MiB)
      expect(() => arena.commit(3 * MiB, 2 * MiB)).toThrow(RangeError)
      expect(() => arena.commit(-1, 1)).toThrow(RangeError)
      expect(arena.commit(0, 4 * MiB)).toBe(true)
      expect(heldBytes(path)).toBe(4 * MiB)
      expect(() => Arena.open(path).commit(0, 1)).toThrow(/grows in the process that created it/)
    })
  )

  it("removes its file when its scope closes", async () => {
    const path = arenaPath()
    await Effect.runPromise(Effect.scoped(Arena.create(path, MiB)))
    expect(existsSync(path)).toBe(false)
  })
})

describe("SlotPool over a growing arena", () => {
  it.scoped("commits a slot before handing it out, and gives none that cannot be committed", () =>
    Effect.gen(function* () {
      const arena = yield* Arena.create(arenaPath(), 8 * MiB)
      let room = true
      const slots = new SlotPool(
        "node-a",
        new SizeClassAllocator(arena.byteLength, { maxBlockBytes: 4 * MiB }),
        (offset, bytes) => room && arena.commit(offset, bytes)
      )
      const first = slots.tryAllocate(MiB)
      expect(first).toBeDefined()
      expect(arena.committedBytes).toBe(MiB)
      // /dev/shm full: as if the arena were.
      room = false
      expect(slots.tryAllocate(MiB)).toBeUndefined()
      expect(slots.stats.bytesInUse).toBe(MiB)
      room = true
      const second = slots.tryAllocate(MiB)
      expect(second).toBeDefined()
      expect(arena.committedBytes).toBe(2 * MiB)
      // A freed slot's memory stays committed and is handed out again without growing.
      slots.release(first!)
      expect(slots.tryAllocate(MiB)).toBe(first)
      expect(arena.committedBytes).toBe(2 * MiB)
    })
  )
})
