/**
 * A small line chart drawn as SVG: one polyline per series (its `points` attribute holds every point,
 * which a test can count), the y axis from zero to a round bound, and a legend. Colours are SVG
 * attributes, not styles, so that the page's CSP needs no inline style.
 */
export interface Series {
  readonly name: string
  readonly points: ReadonlyArray<readonly [x: number, y: number]>
}

export interface LineChartProps {
  readonly title: string
  readonly series: ReadonlyArray<Series>
  readonly formatX: (x: number) => string
  readonly formatY: (y: number) => string
  /** The x range shown; by default the points' own. */
  readonly xDomain?: readonly [number, number]
  /** Said when no series has a point. */
  readonly empty?: string
}

const palette = ["#2f6fde", "#e0672b", "#2a9d5c", "#b83dba", "#c9a227", "#1aa1b5", "#d94362", "#6b6b6b"]
export const colourOf = (index: number) => palette[index % palette.length]!

const width = 520
const height = 200
const left = 56
const right = 12
const top = 10
const bottom = 26

/** The smallest of 1, 2 or 5 times a power of ten at or above `value`. */
const roundBound = (value: number): number => {
  if (!(value > 0) || !Number.isFinite(value)) return 1
  const power = 10 ** Math.floor(Math.log10(value))
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power
  return 10 * power
}

export const LineChart = ({ title, series, formatX, formatY, xDomain, empty }: LineChartProps) => {
  const finite = series.map((one) => ({
    name: one.name,
    points: one.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y))
  }))
  const all = finite.flatMap((one) => one.points)
  const [xMin, xMax] = xDomain ?? [Math.min(...all.map(([x]) => x)), Math.max(...all.map(([x]) => x))]
  const yMax = roundBound(Math.max(0, ...all.map(([, y]) => y)))
  const xSpan = xMax - xMin > 0 ? xMax - xMin : 1
  const px = (x: number) => left + ((x - xMin) / xSpan) * (width - left - right)
  const py = (y: number) => top + (1 - y / yMax) * (height - top - bottom)
  return (
    <figure class="chart" data-title={title}>
      <figcaption>{title}</figcaption>
      <svg viewBox={`0 0 ${width} ${height}`} role="img" aria-label={title}>
        {[0, 0.5, 1].map((share) => (
          <g key={share}>
            <line class="grid" x1={left} x2={width - right} y1={py(share * yMax)} y2={py(share * yMax)} />
            <text class="tick" x={left - 6} y={py(share * yMax) + 4} text-anchor="end">
              {formatY(share * yMax)}
            </text>
          </g>
        ))}
        {all.length > 0 && (
          <g>
            <text class="tick" x={left} y={height - 6} text-anchor="start">
              {formatX(xMin)}
            </text>
            <text class="tick" x={width - right} y={height - 6} text-anchor="end">
              {formatX(xMax)}
            </text>
          </g>
        )}
        {finite.map((one, index) =>
          one.points.length === 0 ? null : (
            <g key={one.name}>
              <polyline
                class="series"
                data-series={one.name}
                fill="none"
                stroke={colourOf(index)}
                stroke-width="2"
                points={one.points.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ")}
              />
              {one.points.length <= 24 &&
                one.points.map(([x, y]) => <circle key={x} cx={px(x)} cy={py(y)} r="2.5" fill={colourOf(index)} />)}
            </g>
          )
        )}
        {all.length === 0 && (
          <text class="empty" x={width / 2} y={height / 2} text-anchor="middle">
            {empty ?? "no data yet"}
          </text>
        )}
      </svg>
      {finite.length > 0 && (
        <ul class="legend">
          {finite.map((one, index) => (
            <li key={one.name}>
              <svg width="14" height="10" aria-hidden="true">
                <line x1="0" x2="14" y1="5" y2="5" stroke={colourOf(index)} stroke-width="3" />
              </svg>
              {one.name}
            </li>
          ))}
        </ul>
      )}
    </figure>
  )
}
