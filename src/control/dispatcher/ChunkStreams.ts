import type { CallObserver } from "../DispatchContract.js"

/** The chunks of `source`, telling `observer` when the first came after `began` and the gaps between the others. */
export async function* timedChunks<A>(
  source: AsyncIterable<A>,
  taskId: string,
  began: number,
  observer: CallObserver
): AsyncIterable<A> {
  let last: number | undefined
  for await (const chunk of source) {
    const now = performance.now()
    if (last === undefined) observer.firstChunk(taskId, (now - began) / 1000)
    else observer.nextChunk(taskId, (now - last) / 1000)
    last = now
    yield chunk
  }
}

/** The chunks of `source`, calling `onEnd` when it is done and `onError` (which rethrows) when it fails. */
export async function* passThrough<A>(
  source: AsyncIterable<A>,
  onEnd: () => void,
  onError: (error: unknown) => never
): AsyncIterable<A> {
  try {
    for await (const chunk of source) yield chunk
  } catch (error) {
    onError(error)
  } finally {
    onEnd()
  }
}
