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

/**
 * A runner's tokens for each prompt, alone (one after another), and batched: all at once, the
 * third joining two steps after the first two, as continuous batching takes a late request.
 */
export const aloneAndBatched = async (
  runner: StepRunner,
  prompts: ReadonlyArray<ReadonlyArray<number>>,
  sampling: SamplingParams
): Promise<{ readonly alone: Array<Array<number>>; readonly batched: Array<Array<number>> }> => {
  const alone: Array<Array<number>> = []
  for (const prompt of prompts) {
    const tokens = await drive(runner, [
      { id: "alone", prompt: { inputIds: Int32Array.from(prompt), media: [] }, sampling, joinAt: 0 }
    ])
    alone.push(tokens.get("alone")!)
  }
  const batched = await drive(
    runner,
    prompts.map((prompt, i) => ({
      id: `r${i}`,
      prompt: { inputIds: Int32Array.from(prompt), media: [] },
      sampling,
      joinAt: i === 2 ? 2 : 0
    }))
  )
  return { alone, batched: prompts.map((_, i) => batched.get(`r${i}`)!) }
}
