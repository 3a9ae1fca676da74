import { useEffect, useMemo, useState } from "preact/hooks"
import { type AnswerState, audioOf, imagesOf, otherValues, shownJson, textOf } from "./answer"
import { formatMs, RefusalNotice } from "./components"
import { base64Bytes, wavOf } from "./wav"

/** Values of a stream shown as JSON: the last ones, so that a long stream does not grow the page. */
const shownValues = 50

/** The audio of a stream as one WAV file, made once the stream has ended (a growing file would restart playing). */
const AnswerAudio = ({ state }: { readonly state: AnswerState }) => {
  const audio = useMemo(() => audioOf(state.values), [state.values])
  const [url, setUrl] = useState<string | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  useEffect(() => {
    if (audio === undefined || !state.done) return
    let made: string | undefined
    try {
      made = URL.createObjectURL(wavOf(audio.chunks.map(base64Bytes), audio.sampleRate))
      setUrl(made)
    } catch (error) {
      setProblem(`the audio could not be read: ${String(error)}`)
    }
    return () => {
      if (made !== undefined) URL.revokeObjectURL(made)
    }
  }, [audio, state.done])
  if (audio === undefined) return null
  return (
    <div class="answer-audio">
      <span class="hint">
        {audio.chunks.length} audio chunk{audio.chunks.length === 1 ? "" : "s"}, {audio.sampleRate} Hz
        {state.done ? "" : " (receiving…)"}
      </span>
      {url !== undefined && (
        // biome-ignore lint/a11y/useMediaCaption: an app's generated audio comes with no captions to show
        <audio controls autoplay src={url} />
      )}
      {problem !== undefined && <p class="error">{problem}</p>}
    </div>
  )
}

export const AnswerView = ({ state }: { readonly state: AnswerState }) => {
  const text = textOf(state.values)
  const images = useMemo(() => imagesOf(state.values), [state.values])
  const others = otherValues(state.values)
  return (
    <div class={`answer ${state.done ? "done" : "streaming"}`}>
      {text !== undefined && <p class="answer-text">{text}</p>}
      {images.map((image) => (
        <figure key={image.path} class="answer-image">
          <img src={image.src} alt={image.path || "image"} />
          {image.path !== "" && <figcaption>{image.path}</figcaption>}
        </figure>
      ))}
      <AnswerAudio state={state} />
      {others.length > 0 && (
        <pre class="answer-json">
          {others.length > shownValues && `… ${others.length - shownValues} earlier values\n`}
          {others
            .slice(-shownValues)
            .map((value) => shownJson(value, state.streamed ? undefined : 2))
            .join("\n")}
        </pre>
      )}
      {state.refusal !== undefined && <RefusalNotice refusal={state.refusal} />}
      <p class="timing">
        {!state.done
          ? state.streamed
            ? `streaming… ${state.values.length} value${state.values.length === 1 ? "" : "s"}`
            : "waiting for the answer…"
          : state.endedAt !== undefined &&
            `${state.streamed ? `${state.values.length} values streamed; first after ${formatMs((state.firstAt ?? state.endedAt) - state.startedAt)}, ` : ""}done in ${formatMs(state.endedAt - state.startedAt)}`}
      </p>
    </div>
  )
}
