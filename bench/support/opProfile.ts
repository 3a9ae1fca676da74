/**
 * Where a decode step's time goes: ONNX Runtime's per-node profile of a decoder's runs (Chrome's
 * trace format: a "Session" event per run, a "Node" event per kernel with its op type), summed by op
 * type over the runs that decode (one new position per row), per step.
 */
import { readFileSync } from "node:fs"

interface TraceEvent {
  readonly cat: string
  readonly name: string
  /** Microseconds. */
  readonly ts: number
  readonly dur: number
  readonly args?: {
    readonly op_name?: string
    readonly input_type_shape?: ReadonlyArray<Record<string, ReadonlyArray<number>>>
  }
}

export interface OpProfile {
  /** Decode runs summed, and the rows each decoded (the batch). */
  readonly steps: number
  readonly rows: number
  /** Milliseconds a decode run took, mean, from the run's own event. */
  readonly stepMs: number
  /** Milliseconds per step by op type, the kernels' own time, most first; `share`: of the step's. */
  readonly ops: ReadonlyArray<{ readonly op: string; readonly ms: number; readonly share: number }>
}

/**
 * The decode runs of a profile: runs whose nodes see one new position per row (an input of shape
 * [rows, 1, hidden] or [rows, 1] on the way in), the first `skip` of them left out (warm-up).
 */
export const decodeProfile = (file: string, skip = 2): OpProfile | undefined => {
  const events = JSON.parse(readFileSync(file, "utf8")) as ReadonlyArray<TraceEvent>
  const runs = events.filter((event) => event.cat === "Session" && event.name === "model_run")
  const nodes = events
    .filter((event) => event.cat === "Node" && event.name.endsWith("_kernel_time"))
    .sort((a, b) => a.ts - b.ts)
  // Each run with its kernels (those that start within it; runs follow one another) and the new
  // positions it sees (its first input of rank 3, the hidden states), in one walk of the kernels.
  let next = 0
  const described = [...runs]
    .sort((a, b) => a.ts - b.ts)
    .map((run) => {
      while (next < nodes.length && nodes[next]!.ts < run.ts) next++
      const first = next
      while (next < nodes.length && nodes[next]!.ts <= run.ts + run.dur) next++
      const kernels = nodes.slice(first, next)
      const dims = kernels
        .flatMap((node) => (node.args?.input_type_shape ?? []).map((input) => Object.values(input)[0]))
        .find((shape) => shape !== undefined && shape.length === 3)
      return { run, kernels, rows: dims?.[0], positions: dims?.[1] }
    })
  const decodes = described.filter((run) => run.positions === 1).slice(skip)
  if (decodes.length === 0) return undefined
  const rows = Math.max(...decodes.map((run) => run.rows!))
  const steps = decodes.filter((run) => run.rows === rows)
  const byOp = new Map<string, number>()
  let kernels = 0
  for (const step of steps) {
    for (const node of step.kernels) {
      const op = node.args?.op_name ?? "?"
      byOp.set(op, (byOp.get(op) ?? 0) + node.dur)
      kernels += node.dur
    }
  }
  const stepUs = steps.reduce((sum, step) => sum + step.run.dur, 0) / steps.length
  const ops = [...byOp]
    .sort((a, b) => b[1] - a[1])
    .map(([op, us]) => ({ op, ms: us / steps.length / 1000, share: us / steps.length / stepUs }))
  // What the run spent outside kernels (ONNX Runtime's own work between them, and waits).
  const outside = stepUs - kernels / steps.length
  return {
    steps: steps.length,
    rows,
    stepMs: stepUs / 1000,
    ops: [...ops, { op: "(between kernels)", ms: outside / 1000, share: outside / stepUs }]
  }
}
