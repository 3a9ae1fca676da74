/**
 * Which process the kernel's out-of-memory killer ends first: the one with the highest score, its
 * share of memory plus its `oom_score_adj` (−1000…1000), which its children inherit. Cornserve raises
 * its children's, so that under memory pressure an executor, and before it a media decoder, goes
 * before the platform's main process. A process may raise its own or its children's; lowering takes
 * a privilege, so these only ever raise.
 */
import { readFileSync, writeFileSync } from "node:fs"

/** The most an adjustment may be: the process is the killer's first choice whatever its size. */
export const maxOomScoreAdj = 1000

/** How far an executor's processes stand above the process that started them. */
export const executorOomScoreMargin = 500

/** The adjustment of a process, or undefined where the kernel has none to read (not Linux, or gone). */
export const readOomScoreAdj = (pid: number): number | undefined => {
  try {
    const value = Number(readFileSync(`/proc/${pid}/oom_score_adj`, "utf8").trim())
    return Number.isInteger(value) ? value : undefined
  } catch {
    return undefined
  }
}

/**
 * Raises the adjustment of `pid` to `to` (at most 1000), never lowering it. Where the kernel has no
 * such file or refuses, the process keeps what it has: the bound is a preference, not a guarantee.
 */
export const raiseOomScoreAdj = (pid: number, to: number): void => {
  const target = Math.min(maxOomScoreAdj, Math.round(to))
  const current = readOomScoreAdj(pid)
  if (current === undefined || current >= target) return
  try {
    writeFileSync(`/proc/${pid}/oom_score_adj`, String(target))
  } catch {
    // Gone already, or a kernel that refuses: the process keeps its score.
  }
}
