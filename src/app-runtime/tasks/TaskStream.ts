/**
 * The output of a task that streams (LLM tokens, audio chunks). While a task graph is recorded it is
 * an empty placeholder; after dispatch it iterates the executor's chunks as they arrive.
 */
export class TaskStream<T> implements AsyncIterable<T> {
  private consumed = false

  private constructor(private readonly source: AsyncIterable<T> | undefined) {}

  static placeholder<T>(): TaskStream<T> {
    return new TaskStream<T>(undefined)
  }

  static of<T>(source: AsyncIterable<T>): TaskStream<T> {
    return new TaskStream(source)
  }

  get isPlaceholder(): boolean {
    return this.source === undefined
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    if (this.source === undefined) {
      throw new Error("a task stream can be read only after its task graph was dispatched (await task.invoke(...))")
    }
    if (this.consumed) throw new Error("a task stream can be read only once")
    this.consumed = true
    return this.source[Symbol.asyncIterator]()
  }

  /** A stream of `f` applied to each chunk; the source is read only through the new stream. */
  map<U>(f: (chunk: T) => U): TaskStream<U> {
    const source = this
    return new TaskStream<U>(
      this.source === undefined
        ? undefined
        : {
            async *[Symbol.asyncIterator]() {
              for await (const chunk of source) yield f(chunk)
            }
          }
    )
  }

  toJSON(): Record<string, never> {
    return {}
  }
}
