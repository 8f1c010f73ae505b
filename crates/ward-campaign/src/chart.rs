//! `outcomes.svg`: for each fault type, one stacked bar per kind of run (native, then each isolation kind), a
//! segment per outcome. Drawn with plotters' SVG backend, whose text is left to the viewer's fonts.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::classify::Outcome;
use crate::config::{CampaignConfig, RunMode};
use crate::error::Error;
use crate::summary::{Row, Summary};

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 520;
/// Narrowest slot of one bar, in pixels.
const SLOT: u32 = 18;
/// Width of a label's character, about (the text is left to the viewer's fonts).
const CHAR: u32 = 7;
/// Bars of one fault type sit side by side; this much of a bar's slot is bar, the rest is gap.
const BAR: f64 = 0.8;

fn colour(o: Outcome) -> RGBColor {
    match o {
        Outcome::HostCrashed => RGBColor(0xd6, 0x27, 0x28),
        Outcome::HostHung => RGBColor(0xff, 0x7f, 0x0e),
        Outcome::Recovered => RGBColor(0x2c, 0xa0, 0x2c),
        Outcome::RecoveredWrongOutput => RGBColor(0xbc, 0xbd, 0x22),
        Outcome::WrongOutputUndetected => RGBColor(0x94, 0x67, 0xbd),
        Outcome::NoEffect => RGBColor(0xc7, 0xc7, 0xc7),
    }
}

/// The chart of one campaign as SVG text: a group of bars per fault type.
pub fn svg(config: &CampaignConfig, summary: &Summary) -> Result<String, Error> {
    let title = format!(
        "ward campaign: {} — outcomes per fault type ({} trials each; bars: {})",
        config.extension,
        config.trials_per_type,
        config.modes().iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
    );
    svg_of(&title, &config.modes(), &summary.rows)
}

/// A chart as SVG text: a group of bars per row (`Row::fault_type` labels it: a fault type, or an extension), one
/// bar per kind of run in `modes`.
pub fn svg_of(title: &str, modes: &[RunMode], rows: &[Row]) -> Result<String, Error> {
    let mut out = String::new();
    draw(&mut out, title, modes, rows).map_err(|e| Error::Chart(e.to_string()))?;
    Ok(out)
}

fn draw(out: &mut String, title: &str, modes: &[RunMode], rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let group = modes.len() + 1;
    let slots = (rows.len() * group).max(1) as f64;
    let tallest = rows.iter().map(|r| r.trials).max().unwrap_or(1).max(1);
    // Many groups (a chart per extension) widen the chart, at least SLOT pixels a bar; labels wider than their
    // group (extension names) hang down from the axis instead.
    let width = WIDTH.max(80 + (slots as u32) * SLOT);
    let group_px = (width - 80) as f64 / slots * group as f64;
    let longest = rows.iter().map(|r| r.fault_type.chars().count()).max().unwrap_or(0) as u32;
    let hang = f64::from(longest * CHAR) > group_px;
    let label_area = if hang { 30 + longest * CHAR } else { 40 };
    let height = HEIGHT + label_area - 40;

    let root = SVGBackend::with_string(out, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let centred = Pos::new(HPos::Center, VPos::Top);
    let heading = ("sans-serif", 17).into_font().color(&BLACK).pos(centred);
    root.draw(&Text::new(title.to_string(), (width as i32 / 2, 8), heading))?;
    legend(&root)?;

    let area = root.margin(56, 8, 8, 12);
    let mut chart = ChartBuilder::on(&area)
        .x_label_area_size(label_area)
        .y_label_area_size(44)
        .build_cartesian_2d(-0.5f64..slots - 0.5, 0u32..tallest)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc("runs").label_style(("sans-serif", 12)).draw()?;

    for (g, row) in rows.iter().enumerate() {
        for (m, mode) in modes.iter().enumerate() {
            let x = (g * group + m) as f64;
            let Some(counts) = row.runs.get(mode) else { continue };
            let mut base = 0;
            for o in Outcome::ALL {
                let n = counts.get(o);
                if n == 0 {
                    continue;
                }
                let bar = Rectangle::new([(x - BAR / 2.0, base), (x + BAR / 2.0, base + n)], colour(o).filled());
                chart.draw_series(std::iter::once(bar))?;
                base += n;
            }
            let (px, py) = chart.backend_coord(&(x, 0));
            let small = ("sans-serif", 10).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
            root.draw(&Text::new(short(*mode), (px, py + 4), small))?;
        }
        let centre = (g * group) as f64 + (modes.len() as f64 - 1.0) / 2.0;
        let (px, py) = chart.backend_coord(&(centre, 0));
        let label = ("sans-serif", 12).into_font().color(&BLACK);
        if hang {
            let down = label.transform(FontTransform::Rotate90).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(row.fault_type.clone(), (px, py + 20), down))?;
        } else {
            root.draw(&Text::new(row.fault_type.clone(), (px, py + 20), label.pos(Pos::new(HPos::Center, VPos::Top))))?;
        }
    }

    root.present()?;
    Ok(())
}

/// One swatch per outcome, in a line under the title.
fn legend(root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> Result<(), Box<dyn std::error::Error>> {
    let mut x = 70;
    for o in Outcome::ALL {
        root.draw(&Rectangle::new([(x, 32), (x + 12, 44)], colour(o).filled()))?;
        let text = ("sans-serif", 12).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(o.label(), (x + 16, 38), text))?;
        // Room for the label at about 7 pixels a character, and a gap.
        x += 30 + 7 * o.label().len() as i32;
    }
    Ok(())
}

/// A bar's label: there is room for four letters.
fn short(mode: RunMode) -> &'static str {
    match mode {
        RunMode::Native => "nat",
        RunMode::Mpk => "mpk",
        RunMode::Process => "proc",
        RunMode::None => "none",
    }
}
