import type { RequestObserver } from "../DispatchContract.js"
import { BusyClock, type RequestTiming } from "../../metrics/BusyClock.js"
import { type Span, startSpan } from "../../tracing/Tracing.js"

interface RequestClock {
  readonly requestId: string
  readonly started: number
  /** Made at the request's first dispatch: a request that dispatches nothing (an app without tasks) needs none. */
  timing: RequestTiming | undefined
  /** The request's time in the app, in its trace. */
  readonly span: Span
}

/**
 * Where the time of an app's requests goes: each request's span in the app, and how long it spent
 * in task dispatches and executor calls, told to the observer when the request ends.
 */
export class RequestClocks {
  private readonly byRid = new Map<number, RequestClock>()
  private readonly byId = new Map<string, RequestClock>()

  constructor(
    private readonly appId: string,
    private readonly observer: RequestObserver | undefined
  ) {}

  /** Request `rid` was handed to the app; `parent` is the gateway's span of it. */
  start(rid: number, requestId: string, parent: Span | undefined): void {
    const span = startSpan(`app ${this.appId}`, {
      parent,
      attributes: { "cornserve.app": this.appId, "cornserve.request_id": requestId }
    })
    const clock: RequestClock = { requestId, started: performance.now(), timing: undefined, span }
    this.byRid.set(rid, clock)
    this.byId.set(requestId, clock)
  }

  /** What a dispatch of request `requestId` counts its time in and traces under (none for an unknown request). */
  dispatchOf(requestId: string): { readonly timing?: RequestTiming; readonly span?: Span } {
    const clock = this.byId.get(requestId)
    if (clock === undefined) return {}
    clock.timing ??= { dispatches: new BusyClock(), executors: new BusyClock() }
    return { timing: clock.timing, span: clock.span }
  }

  /**
   * A request ended (failed with `failure`, or cancelled by its client): its span ends, where its
   * time went goes to the observer.
   */
  stop(rid: number, failure?: { readonly _tag: string; readonly message: string } | "cancelled"): void {
    const clock = this.byRid.get(rid)
    if (clock === undefined) return
    this.byRid.delete(rid)
    this.byId.delete(clock.requestId)
    if (failure === "cancelled") {
      clock.span.attribute("cornserve.cancelled", true)
      clock.span.end()
    } else clock.span.end(failure)
    const now = performance.now()
    this.observer?.ended(
      this.appId,
      (now - clock.started) / 1000,
      (clock.timing?.dispatches.busyMs(now) ?? 0) / 1000,
      (clock.timing?.executors.busyMs(now) ?? 0) / 1000
    )
  }
}
