#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "diagnose/render.h"

namespace oomtune::diagnose {
namespace {

using nlohmann::json;

json categories(const CategoryBytes& c) {
  json j = json::object();
  for (int i = 0; i < kNumCategories; ++i) {
    j[std::string(category_name(static_cast<Category>(i))) + "_bytes"] = c[static_cast<size_t>(i)];
  }
  return j;
}

json site(const SiteBytes& s) {
  return json{{"site", s.site},     {"filename", s.filename},
              {"line", s.line},     {"function", s.function},
              {"layer", s.layer},   {"call_site", s.call_site},
              {"others", s.others}, {"bytes", s.bytes},
              {"blocks", s.blocks}, {"category", category_name(s.category)}};
}

json sites(const std::vector<SiteBytes>& v) {
  json a = json::array();
  for (const auto& s : v) a.push_back(site(s));
  return a;
}

json tagged(const TaggedBytes& t) {
  auto list = [](const std::vector<TagBytes>& v) {
    json a = json::array();
    for (const TagBytes& b : v) a.push_back({{"tag", b.tag}, {"bytes", b.bytes}, {"blocks", b.blocks}});
    return a;
  };
  return json{{"user_metadata", list(t.user_metadata)},
              {"compile_contexts", list(t.compile_contexts)},
              {"record_functions", list(t.record_functions)}};
}

}  // namespace

std::string render_json(const Diagnosis& d) {
  json j;
  j["file"] = d.file;
  j["file_bytes"] = d.file_bytes;
  j["group_by"] = group_by_name(d.group_by);
  j["torch_roots"] = d.torch_roots;
  j["layout"] = d.layout;
  const AllocatorSettings& s = d.allocator_settings;
  j["allocator_settings"] = {{"present", s.present},
                             {"conf", s.conf},
                             {"max_split_size_bytes", s.max_split_size},
                             {"garbage_collection_threshold", s.garbage_collection_threshold},
                             {"expandable_segments", s.expandable_segments}};
  const TraceSummary& t = d.trace;
  j["trace"] = {{"device", t.device},
                {"layout_has_traces", t.layout_has_traces},
                {"events", t.events},
                {"duration_us", t.duration_us},
                {"iterations", t.iterations},
                {"events_per_iteration", t.events_per_iteration},
                {"truncated", t.truncated},
                {"allocated_before_recording_bytes", t.allocated_before_recording_bytes},
                {"allocated_before_trace_with_frames_bytes", t.allocated_before_trace_with_frames_bytes},
                {"reserved_before_recording_bytes", t.reserved_before_recording_bytes},
                {"alloc_events", t.alloc_events},
                {"alloc_events_without_frames", t.alloc_events_without_frames},
                {"bytes_without_frames", t.bytes_without_frames},
                {"frameless_inferred_backward", t.frameless_inferred_backward},
                {"alloc_events_in_marked_phases", t.alloc_events_in_marked_phases},
                {"frameless_in_optimizer_marks", t.frameless_in_optimizer_marks},
                {"alloc_events_with_user_metadata", t.alloc_events_with_user_metadata},
                {"alloc_events_in_compiled_regions", t.alloc_events_in_compiled_regions},
                {"cpp_frames", t.cpp_frames},
                {"generated_frames", t.generated_frames},
                {"fx_traced_frames", t.fx_traced_frames},
                {"empty_cache_calls", t.empty_cache_calls},
                {"fx_frames_without_source", t.fx_frames_without_source},
                {"forward_alloc_events", t.forward_alloc_events},
                {"checkpointed_forward_allocs", t.checkpointed_forward_allocs},
                {"recomputed_backward_allocs", t.recomputed_backward_allocs},
                {"inconsistencies", t.inconsistencies},
                {"replay_matches_dump", t.replay_matches_dump},
                {"dumped_allocated_bytes", t.dumped_allocated_bytes},
                {"dumped_reserved_bytes", t.dumped_reserved_bytes},
                {"frames_note", t.frames_note},
                {"free_requested_skipped", t.free_requested_skipped},
                {"free_completed_skipped", t.free_completed_skipped},
                {"actions_note", t.actions_note}};
  json others = json::array();
  for (const DeviceContent& c : d.other_devices) {
    others.push_back({{"device", c.device},
                      {"events", c.events},
                      {"ooms", c.ooms},
                      {"reserved_bytes", c.reserved_bytes},
                      {"allocated_bytes", c.allocated_bytes}});
  }
  j["other_devices"] = others;
  json verdicts = json::array();
  for (const auto& v : d.verdicts) {
    verdicts.push_back({{"id", verdict_name(v.id)}, {"title", verdict_kind(v.id).title}, {"evidence", v.evidence}});
  }
  j["verdicts"] = verdicts;
  json ooms = json::array();
  for (const OomReport& o : d.ooms) {
    ooms.push_back({{"event_index", o.event_index},
                    {"time_us", o.time_us},
                    {"requested_bytes", o.requested_bytes},
                    {"rounded_bytes", o.rounded_bytes},
                    {"pool", o.large_pool ? "large" : "small"},
                    {"segment_bytes", o.segment_bytes},
                    {"device_free_bytes", o.device_free_bytes},
                    {"allocated_bytes", o.allocated_bytes},
                    {"reserved_bytes", o.reserved_bytes},
                    {"reserved_free_bytes", o.reserved_free_bytes},
                    {"pool_free_bytes", o.pool_free_bytes},
                    {"largest_free_block_bytes", o.largest_free_block_bytes},
                    {"fully_free_segment_bytes", o.fully_free_segment_bytes},
                    {"stream", o.stream},
                    {"other_stream_segments", o.other_stream_segments},
                    {"other_stream_reserved_bytes", o.other_stream_reserved_bytes},
                    {"other_stream_free_bytes", o.other_stream_free_bytes},
                    {"other_stream_largest_free_block_bytes", o.other_stream_largest_free_block_bytes},
                    {"other_stream_holders", sites(o.other_stream_holders)},
                    {"private_pool_segments", o.private_pool_segments},
                    {"private_pool_reserved_bytes", o.private_pool_reserved_bytes},
                    {"private_pool_free_bytes", o.private_pool_free_bytes},
                    {"captures_cuda_graph", o.captures_cuda_graph},
                    {"fragmentation", o.fragmentation},
                    {"memory_cap", o.memory_cap},
                    {"cap_low_bytes", o.cap_low_bytes},
                    {"cap_high_bytes", o.cap_high_bytes},
                    {"phase", phase_name(o.phase)},
                    {"layer", o.layer},
                    {"call_site", o.call_site},
                    {"model_forward", o.model_forward},
                    {"user_metadata", o.user_metadata},
                    {"compile_context", o.compile_context},
                    {"record_functions", o.record_functions},
                    {"recomputing", o.recomputing},
                    {"inference", o.inference()},
                    {"inference_kind", inference_kind_name(o.inference_kind)},
                    {"eval_outputs",
                     {{"bytes", o.eval_outputs.bytes},
                      {"at_concat", o.eval_outputs.at_concat},
                      {"step_bytes", o.eval_outputs.step_bytes},
                      {"steps", o.eval_outputs.steps}}},
                    {"nothing_saved",
                     {{"block_allocations", o.nothing_saved.block_allocations},
                      {"freed_allocations", o.nothing_saved.freed_allocations},
                      {"freed_bytes", o.nothing_saved.freed_bytes},
                      {"first_event", o.nothing_saved.first_event},
                      {"last_event", o.nothing_saved.last_event}}},
                    {"alive", categories(o.live_by_category)}});
  }
  j["ooms"] = ooms;
  json caught = json::array();
  for (const CaughtOom& c : d.caught_ooms) {
    caught.push_back({{"event_index", c.event_index},
                      {"time_us", c.time_us},
                      {"requested_bytes", c.requested_bytes},
                      {"allocated_bytes", c.allocated_bytes},
                      {"reserved_bytes", c.reserved_bytes},
                      {"phase", phase_name(c.phase)},
                      {"layer", c.layer},
                      {"call_site", c.call_site},
                      {"in_convolution", c.in_convolution},
                      {"batch_size_finder", batch_size_finder_name(c.batch_size_finder)},
                      {"allocations_after", c.allocations_after}});
  }
  j["caught_ooms"] = caught;
  j["oom_sites"] = sites(d.oom_sites);
  j["oom_tags"] = tagged(d.oom_tags);
  j["peak"] = {{"event_index", d.peak.event_index},
               {"time_us", d.peak.time_us},
               {"allocated_bytes", d.peak.allocated_bytes},
               {"reserved_bytes", d.peak.reserved_bytes},
               {"phase", phase_name(d.peak.phase)},
               {"alive", categories(d.peak.by_category)},
               {"sites", sites(d.peak.sites)},
               {"tags", tagged(d.peak.tags)}};
  json leaks = json::array();
  for (const LeakSuspect& l : d.leaks) {
    leaks.push_back({{"site", site(l.site)},
                     {"growth_per_iteration_bytes", l.growth_per_iteration_bytes},
                     {"iterations", l.iterations},
                     {"first_live_bytes", l.first_live_bytes},
                     {"last_live_bytes", l.last_live_bytes}});
  }
  j["leaks"] = leaks;
  j["optimizer"] = nullptr;
  if (d.optimizer) {
    j["optimizer"] = {{"name", d.optimizer->name},
                      {"states_per_parameter", d.optimizer->states_per_parameter},
                      {"states", d.optimizer->states},
                      {"options", d.optimizer->options},
                      {"eight_bit", d.optimizer->eight_bit}};
  }
  const PhaseNeed& n = d.need;
  j["need"] = {{"known", n.known},
               {"phase", phase_name(n.phase)},
               {"method", need_method_name(n.method)},
               {"still_needed_bytes", n.still_needed_bytes},
               {"lower_bound", n.lower_bound},
               {"estimate", n.estimate},
               {"grown_bytes", n.grown_bytes},
               {"earlier_growth_bytes", n.earlier_growth_bytes},
               {"later_peak_bytes", n.later_peak_bytes},
               {"later_peak_phase", n.later_peak_bytes > 0 ? json(phase_name(n.later_peak_phase)) : json(nullptr)},
               {"states_per_parameter", n.states_per_parameter},
               {"states_added_by_options", n.states_added_by_options},
               {"state_total_bytes", n.state_total_bytes},
               {"optimizer_implementation", implementation_name(n.implementation)},
               {"optimizer_implementation_assumed", n.implementation_assumed()},
               {"optimizer_implementation_basis", implementation_basis_name(n.implementation_basis)},
               {"temporaries_modelled", n.temporaries_modelled},
               {"temporaries_total_bytes", n.temporaries_total_bytes},
               {"temporaries_left_bytes", n.temporaries_left_bytes},
               {"blocks_done", n.blocks_done},
               {"block_bytes", n.block_bytes},
               {"block_so_far_bytes", n.block_so_far_bytes},
               {"model_blocks", n.model_blocks},
               {"blocks_after", n.blocks_after},
               {"block_peak_bytes", n.block_peak_bytes},
               {"last_block_peak_bytes", n.last_block_peak_bytes},
               {"block_net_bytes", n.block_net_bytes},
               {"stem_gradient_bytes", n.stem_gradient_bytes},
               {"tied_gradient_sum_bytes", n.tied_gradient_sum_bytes},
               {"head_bytes", n.head_bytes},
               {"loss_bytes", n.loss_bytes},
               {"recomputed_allocs", n.recomputed_allocs},
               {"forward_first_event", n.forward_first_event},
               {"forward_last_event", n.forward_last_event}};
  json recs = json::array();
  for (const Recommendation& r : d.recommendations) {
    static constexpr const char* kSufficiency[] = {"unknown",
                                                   "enough",
                                                   "not_enough",
                                                   "no_memory_effect",
                                                   "enough_up_to_blocks",
                                                   "enough_if_cap_at_least",
                                                   "enough_for_request",
                                                   "enough_for_recomputation",
                                                   "enough_for_backward_blocks",
                                                   "enough_for_recomputed_blocks"};
    json parts = json::array();
    for (size_t i = 0; i < r.parts.size(); ++i) {
      parts.push_back({{"id", fix_name(r.parts[i])}, {"frees_bytes", r.part_frees_bytes[i]}});
    }
    recs.push_back({{"id", fix_name(r.id)},
                    {"change", r.change},
                    {"reason", r.reason},
                    {"frees_bytes", r.frees_bytes},
                    {"estimate", r.estimate},
                    {"sufficiency", kSufficiency[static_cast<size_t>(r.sufficiency)]},
                    {"needs_bytes", r.needs_bytes},
                    {"most_blocks", r.most_blocks},
                    {"smallest_cap_bytes", r.smallest_cap_bytes},
                    {"verdict", sufficiency_text(r)},
                    {"parts", parts}});
  }
  j["recommendations"] = recs;
  if (d.as_recorded_replay.replayed && !d.ooms.empty()) {
    const SettingReplay& r = d.as_recorded_replay;
    j["as_recorded_replay"] = {{"reproduces_oom", r.reproduces(d.ooms.back().event_index)},
                               {"fits", r.fits},
                               {"failed_event", r.failed_event},
                               {"reserved_bytes", r.reserved_bytes}};
  } else {
    j["as_recorded_replay"] = nullptr;
  }
  json timeline = json::array();
  for (const TimelinePoint& p : d.timeline) {
    json point = {{"event_index", p.event_index},
                  {"time_us", p.time_us},
                  {"allocated_bytes", p.allocated_bytes},
                  {"reserved_bytes", p.reserved_bytes}};
    point["by_category"] = categories(p.by_category);
    timeline.push_back(std::move(point));
  }
  j["timeline"] = timeline;
  json segs = json::array();
  for (const SegmentView& v : d.segment_map) {
    json blocks = json::array();
    for (const auto& b : v.blocks) {
      blocks.push_back({{"offset_bytes", b.offset},
                        {"size_bytes", b.size},
                        {"allocated", b.allocated},
                        {"category", category_name(b.category)}});
    }
    segs.push_back({{"address", v.address},
                    {"size_bytes", v.size},
                    {"pool", v.is_large ? "large" : "small"},
                    {"expandable", v.is_expandable},
                    {"live_blocks", blocks}});
  }
  j["segment_map"] = {{"moment", d.map_moment}, {"segments", segs}};
  return json_text(j, 1) + "\n";
}

}  // namespace oomtune::diagnose
