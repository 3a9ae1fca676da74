import type { PromptInput, SamplingParams, StepOp, TokenPartial } from "../../src/executors/llm/protocol.js"
import type { StepRunner } from "../../src/executors/llm/StepRunner.js"

export interface Scripted {
  readonly id: string
  readonly prompt: PromptInput
  readonly sampling: SamplingParams
  /** The step at which it joins. */
  readonly joinAt: number
  /** The step at which it is cancelled, if it is. */
  readonly cancelAt?: number
}

/** Drives a runner the way the engine does; answers each request's tokens. */
export const drive = async (
  runner: StepRunner,
  requests: ReadonlyArray<Scripted>
): Promise<Map<string, Array<number>>> => {
  const tokens = new Map(requests.map((request) => [request.id, [] as Array<number>]))
  const running = new Set<string>()
  const finished = new Set<string>()
  for (let step = 0; finished.size < requests.length; step++) {
    const items: Array<{ id: string; op: StepOp }> = []
    for (const request of requests) {
      if (request.cancelAt === step && !finished.has(request.id)) {
        items.push({ id: request.id, op: { op: "free" } })
        running.delete(request.id)
        finished.add(request.id)
      }
    }
    for (const id of running) items.push({ id, op: { op: "decode" } })
    for (const request of requests.filter((r) => r.joinAt === step)) {
      items.push({ id: request.id, op: { op: "prefill", prompt: request.prompt, sampling: request.sampling } })
      running.add(request.id)
    }
    if (items.length === 0) continue
    await runner.step(items, (index, partial: TokenPartial) => {
      const id = items[index]!.id
      tokens.get(id)!.push(partial.token)
      if (partial.finish !== undefined) {
        running.delete(id)
        finished.add(id)
      }
    })
  }
  return tokens
}
