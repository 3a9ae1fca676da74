import { watchSignal } from "../../app-runtime/driver/Cancellation.js"
import type { FromApp, ToApp } from "../../app-runtime/driver/protocol.js"
import { dispatchWindowChunks, SendWindow } from "../../app-runtime/driver/StreamWindow.js"
import type { TaskGraphWire } from "../../app-runtime/tasks/TaskGraph.js"
import { type AppShare, dispatchFailureOf, type GraphDispatcher } from "../DispatchContract.js"
import type { RequestClocks } from "./RequestClocks.js"

/**
 * The task graphs an app's process asks the platform to run for its requests (its dispatches):
 * each checked against what the process may ask (a dispatch id it has not used, tasks its app
 * declared), run by the dispatcher, and answered over the channel, a stream chunk by chunk within
 * the window the app acknowledges. A restarted process numbers its dispatches from 0 again.
 */
export class AppDispatches {
  private readonly running = new Map<number, AbortController>()
  private readonly windows = new Map<number, SendWindow>()
  /** The lowest dispatch id the app's current process has not used: its ids only grow. */
  private nextId = 0
  /** The unit tasks the app declared when it loaded: the only ones it may dispatch. */
  private declaredTasks: ReadonlySet<string> = new Set()

  constructor(
    private readonly dispatch: GraphDispatcher,
    private readonly clocks: RequestClocks,
    private readonly post: (message: ToApp) => void,
    /** The app's claim on shared tasks, as it stands when a dispatch starts. */
    private readonly share: () => AppShare
  ) {}

  /** A new process of the app: its dispatch ids start again. */
  newProcess(): void {
    this.nextId = 0
  }

  /** The app loaded, declaring these unit tasks. */
  declare(taskIds: ReadonlyArray<string>): void {
    this.declaredTasks = new Set(taskIds)
  }

  /** Whether the app's current process made dispatch `did` (it may have ended). */
  made(did: number): boolean {
    return did >= 0 && did < this.nextId
  }

  /** Runs a dispatch the process asked for; answers why it breaks the protocol instead, when it does. */
  start(message: Extract<FromApp, { readonly t: "dispatch" }>): string | undefined {
    if (message.did < this.nextId) return `it used dispatch id ${message.did} again`
    const undeclared = message.graph.invocations.find((invocation) => !this.declaredTasks.has(invocation.taskId))
    if (undeclared !== undefined)
      return `it dispatched task ${undeclared.taskId.slice(0, 200)}, which its app does not declare`
    this.nextId = message.did + 1
    void this.run(message.did, message.requestId, message.graph)
    return undefined
  }

  /** The app no longer wants dispatch `did`. */
  cancel(did: number): void {
    this.running.get(did)?.abort()
    this.running.delete(did)
    this.windows.delete(did)
  }

  /** The app took `chunks` more chunks of dispatch `did`'s stream. */
  credit(did: number, chunks: number): void {
    this.windows.get(did)?.acknowledged(chunks)
  }

  /** Stops every running dispatch; `forget`: and forgets them (their process is gone). */
  abortAll(forget: boolean): void {
    for (const controller of this.running.values()) controller.abort()
    if (!forget) return
    this.running.clear()
    this.windows.clear()
  }

  private async run(did: number, requestId: string, graph: TaskGraphWire) {
    const controller = new AbortController()
    this.running.set(did, controller)
    const request = this.clocks.dispatchOf(requestId)
    request.timing?.dispatches.enter()
    try {
      const outcome = await this.dispatch(graph, requestId, controller.signal, { ...request, share: this.share() })
      if (controller.signal.aborted) return
      this.post({ t: "dispatched", did, outputs: outcome.outputs, streams: outcome.stream !== undefined })
      if (outcome.stream !== undefined) {
        const window = new SendWindow(dispatchWindowChunks)
        this.windows.set(did, window)
        for await (const chunk of outcome.stream) {
          if (controller.signal.aborted) return
          // Not pulling the next chunk leaves the executor's response body unread: its TCP stream pauses.
          if (!window.open) await window.opened(watchSignal(controller.signal))
          if (controller.signal.aborted) return
          this.post({ t: "dispatch-chunk", did, chunk })
          window.sent(1)
        }
        this.post({ t: "dispatch-end", did })
      }
    } catch (error) {
      if (!controller.signal.aborted) {
        this.post({ t: "dispatch-failed", did, failure: dispatchFailureOf(error) })
      }
    } finally {
      request.timing?.dispatches.leave()
      // A restarted process numbers its dispatches from 0 again: leave its dispatch of the same id alone.
      if (this.running.get(did) === controller) {
        this.running.delete(did)
        this.windows.delete(did)
      }
    }
  }
}
